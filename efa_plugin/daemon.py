"""``efa-device-plugin serve``: the declaration the device-plugin service runs (:mod:`accel_core.deviceplugin.daemon`).

Registers first: this module imports only what serving and registering need; the policy, the scan and metrics load
once the kubelet has the registration (:func:`load`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from accel_core.deviceplugin.daemon import DevicePluginDaemon, DevicePluginService, serving
from efa_plugin import COEXISTENCE, RESOURCE_NAME, SOCKET_NAME
from efa_plugin.presence import efa_expected

if TYPE_CHECKING:
    from efa_plugin.policy import EfaPolicy

DAEMON_NAME = "efa-device-plugin"
#: a full rescan of 32 devices costs ~5 ms of CPU: on inotify/udev events, on a port-state change the health poll
#: sees, and on this slow safety interval only (an idle daemon pays it on every node)
DEFAULT_RESCAN_S = 60.0
#: each poll of the 32 port-state files wakes the daemon (~0.2 ms); every 0.75 s keeps a port change on a real node
#: (no sysfs event) under 1 s from the kubelet, for 2/3 of the wake-ups 0.5 s cost
DEFAULT_HEALTH_POLL_S = 0.75


def load(service: DevicePluginService) -> EfaPolicy:
    """The EFA policy (the profile), and its metrics: counters read at scrape time, allocations from PodResources."""
    from accel_core.metrics import CallbackCollector
    from efa_plugin.metrics import AllocatedDevices, EfaMetrics
    from efa_plugin.policy import EfaPolicy

    policy = EfaPolicy(service.paths)
    allocated = AllocatedDevices(service.paths.pod_resources_socket, RESOURCE_NAME)
    service.on_close(allocated.close)
    service.registry.register(CallbackCollector(EfaMetrics(policy, allocated)))
    return policy


PLUGIN = DevicePluginDaemon(DAEMON_NAME, ((RESOURCE_NAME, SOCKET_NAME),), COEXISTENCE, load, probe=efa_expected)
serve = serving(PLUGIN)
