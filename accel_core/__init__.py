"""Shared core for the AWS accelerator node agents: host access, kubelet adapters, CDI, metrics, fake host."""
