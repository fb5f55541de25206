"""What ``neuron-device-plugin serve`` is told, and the two registrations' names: light enough to load before the
first Register (see :func:`neuron_dra.deviceplugin.cli.main`)."""

from __future__ import annotations

import argparse
from dataclasses import dataclass

from accel_core.cli import EnvFlag, node_name, seconds, seconds_or_zero
from accel_core.paths import ENV_NODE_NAME
from neuron_dra import NEURON_SOCKET, NEURONCORE_SOCKET
from neuron_dra.deviceplugin.inuse import NEURON, NEURONCORE
from neuron_dra.runtime_env import CORE_NUMBERING_FLAG, CoreNumbering

#: resource -> socket, in registration order
__all__ = ["NEURONCORE_SOCKET", "NEURON_SOCKET", "FLAGS", "REGISTRATIONS", "ServeOptions"]
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

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> ServeOptions:
        """From ``neuron-device-plugin serve``'s flags; intervals of at least 50 ms."""
        return cls(rescan_interval=max(0.05, args.rescan_interval),
                   health_poll_interval=max(0.05, args.health_poll_interval),
                   pod_resources_interval=max(0.05, args.pod_resources_interval),
                   pod_resources_idle_interval=max(0.05, args.pod_resources_idle_interval),
                   allocation_grace=max(0.0, args.allocation_grace), core_numbering=args.core_numbering,
                   metrics_port=args.metrics_port, metrics_address=args.metrics_address, node_name=args.node_name,
                   kubeconfig=args.kubeconfig)


#: ``neuron-device-plugin serve``'s own flags, besides those every device plugin has (DevicePluginCli).
FLAGS = (
    EnvFlag("--pod-resources-interval", "POD_RESOURCES_INTERVAL", seconds, 2.0,
            "seconds between PodResources List calls while devices are held or pending "
            "(env POD_RESOURCES_INTERVAL; default 2)"),
    EnvFlag("--pod-resources-idle-interval", "POD_RESOURCES_IDLE_INTERVAL", seconds, 30.0,
            "seconds between PodResources List calls while no device is held or pending; an Allocate ends the wait "
            "(env POD_RESOURCES_IDLE_INTERVAL; default 30)"),
    EnvFlag("--allocation-grace", "ALLOCATION_GRACE", seconds_or_zero, 30.0,
            "seconds an Allocate stays in use without PodResources confirming it (env ALLOCATION_GRACE; default 30)"),
    CORE_NUMBERING_FLAG,
    EnvFlag("--node-name", ENV_NODE_NAME, node_name, None,
            "this node's name, for the UltraServer labels on its Node (env NODE_NAME)"),
    EnvFlag("--kubeconfig", None, str, None,
            "kubeconfig for the Node labels (default: KUBECONFIG, then in-cluster; none: no labels)"),
)
