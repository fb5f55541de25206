"""Generic DRA kubelet-plugin adapter: registration, the v1/v1beta1 DRA services, health stream, CDI, checkpoint."""
