"""Developer tools: the real Kubernetes control plane on loopback (``controlplane``; its certificates and
kubeconfigs in ``controlplane_pki``, its process records in ``controlplane_processes``), the ``accel-cluster``
command (``cluster``) and the pinned upstream versions (``kubeversions``)."""
