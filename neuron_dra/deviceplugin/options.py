"""What ``neuron-device-plugin serve`` is told, and the two registrations' names: light enough to load before the
first Register (see :func:`neuron_dra.deviceplugin.cli.main`)."""

from __future__ import annotations

from dataclasses import dataclass

from neuron_dra.deviceplugin.usage import NEURON, NEURONCORE
from neuron_dra.runtime_env import CoreNumbering

NEURON_SOCKET = "neuron-devplugin.sock"
NEURONCORE_SOCKET = "neuroncore-devplugin.sock"
#: resource -> socket, in registration order
REGISTRATIONS = ((NEURON, NEURON_SOCKET), (NEURONCORE, NEURONCORE_SOCKET))


@dataclass(frozen=True)
class ServeOptions:
    rescan_interval: float = 30.0
    health_poll_interval: float = 0.5
    pod_resources_interval: float = 2.0
    pod_resources_idle_interval: float = 30.0
    allocation_grace: float = 30.0
    core_numbering: CoreNumbering = "container"
    metrics_port: int = 0
    metrics_address: str = "127.0.0.1"
    retry_interval: float = 1.0
    node_name: str | None = None
    """Our Node, for its labels (None: no labels)."""
    kubeconfig: str | None = None
