"""Developer tools: the real Kubernetes control plane on loopback (``controlplane``; its certificates and
kubeconfigs in ``controlplane_pki``, its process records in ``controlplane_processes``, component flags in
``controlplane_flags``, readiness probes in ``controlplane_health``, the admin API in ``controlplane_api``), real
kubelet nodes (``kubeletnode``; ``nodelayout``, ``kubeletconfig``, ``fakecrirecords``, ``podlogs``), the
``accel-cluster`` command (``cluster``) and the pinned upstream versions (``kubeversions``)."""
