"""Developer tools: the real Kubernetes control plane on loopback (``controlplane``), the ``accel-cluster``
command (``cluster``) and the pinned upstream versions (``kubeversions``)."""
