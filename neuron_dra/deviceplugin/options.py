"""What ``neuron-device-plugin serve`` is told, and the two registrations' names: light enough to load before the
first Register (see :func:`neuron_dra.deviceplugin.cli.main`)."""

from __future__ import annotations

from dataclasses import dataclass

from neuron_dra import NEURON_SOCKET, NEURONCORE_SOCKET
from neuron_dra.deviceplugin.usage import NEURON, NEURONCORE
from neuron_dra.runtime_env import CoreNumbering

#: resource -> socket, in registration order
__all__ = ["NEURONCORE_SOCKET", "NEURON_SOCKET", "REGISTRATIONS", "ServeOptions"]
REGISTRATIONS = ((NEURON, NEURON_SOCKET), (NEURONCORE, NEURONCORE_SOCKET))
#: A full rescan (discovery of 16 devices, both device lists, the usage annotation, re-arming inotify) costs ~12 ms
#: of CPU on trn2.48xlarge; inotify/udev events and health changes start one at once, so this is a safety net only
#: (an idle daemon pays it on every node: 30 s -> 60 s took 0.0125 s per 30 s off the idle CPU).
DEFAULT_RESCAN_S = 60.0
#: Each poll of the 32 uncorrected-error counters (no sysfs event when they rise) wakes the daemon; every 0.75 s
#: keeps a counter change under 1 s from the kubelet (poll, 50 ms debounce, quick rescan, ListAndWatch send)
#: for 2/3 of the wake-ups 0.5 s cost.
DEFAULT_HEALTH_POLL_S = 0.75


@dataclass(frozen=True)
class ServeOptions:
    rescan_interval: float = DEFAULT_RESCAN_S
    health_poll_interval: float = DEFAULT_HEALTH_POLL_S
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
