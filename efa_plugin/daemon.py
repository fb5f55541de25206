"""``efa-device-plugin serve``: one registration, the host watcher, metrics.

Registers first: this module imports only what serving and registering need; the scan, the policy, metrics and
the watchers load once the kubelet has the registration (:func:`run_plugin`).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

from accel_core.deviceplugin.pluginserver import DevicePluginServer, register_first
from accel_core.logs import kv
from accel_core.paths import HostPaths
from efa_plugin import RESOURCE_NAME, SOCKET_NAME
from efa_plugin.presence import efa_expected

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry

log = logging.getLogger("efa_plugin")

DAEMON_NAME = "efa-device-plugin"
#: a full rescan of 32 devices costs ~5 ms of CPU: on inotify/udev events, on a port-state change the health poll
#: sees, and on this slow safety interval only (an idle daemon pays it on every node)
DEFAULT_RESCAN_S = 60.0
#: each poll of the 32 port-state files wakes the daemon (~0.2 ms); every 0.75 s keeps a port change on a real node
#: (no sysfs event) under 1 s from the kubelet, for 2/3 of the wake-ups 0.5 s cost
DEFAULT_HEALTH_POLL_S = 0.75


async def run_plugin(paths: HostPaths, stop: asyncio.Event, *, registry: CollectorRegistry | None = None,
                     rescan_interval: float = DEFAULT_RESCAN_S, retry_interval: float = 1.0,
                     health_poll_interval: float = DEFAULT_HEALTH_POLL_S, metrics_port: int = 0,
                     metrics_address: str = "127.0.0.1", node_name: str | None = None,
                     kubeconfig: str | None = None) -> None:
    """The daemon body: serve and register, then discover, follow host changes until ``stop``.

    Also used by the component tests and the benchmark, so they exercise exactly this wiring.
    """
    server = DevicePluginServer(None, paths, resource_name=RESOURCE_NAME, socket_name=SOCKET_NAME,
                                expect_devices=lambda: efa_expected(paths), retry_interval=retry_interval)
    await register_first([server], stop)
    # the kubelet knows us (or there is nothing to register yet): load the rest now
    from prometheus_client import CollectorRegistry

    from accel_core.deviceplugin.handover import DraHandover
    from accel_core.deviceplugin.runner import serve_device_plugins
    from accel_core.metrics import CallbackCollector, serve_metrics
    from accel_core.nodeevents import LazyClient, NodeEvents
    from efa_plugin import COEXISTENCE
    from efa_plugin.metrics import AllocatedDevices, EfaMetrics
    from efa_plugin.policy import EfaPolicy

    registry = registry if registry is not None else CollectorRegistry()
    policy = EfaPolicy(paths)
    await asyncio.to_thread(policy.rediscover)  # off the loop: the kubelet may be calling us already
    client = LazyClient(kubeconfig, DAEMON_NAME)
    handover = DraHandover(COEXISTENCE, paths, lambda: policy.scanner.device_plugin_ids(policy.inventory),
                           events=NodeEvents(client, node_name, DAEMON_NAME))
    await handover.refresh()  # whether the DRA driver serves this node, and what its claims hold
    server.held = handover.held
    allocated = AllocatedDevices(paths.pod_resources_socket, RESOURCE_NAME)
    registry.register(CallbackCollector(EfaMetrics(policy, allocated)))
    metrics_server = serve_metrics(registry, metrics_port, metrics_address, not_ready=handover.not_ready)
    await server.attach(policy, registry)
    real_host = os.path.realpath(paths.host_root) == "/"

    def rediscover() -> None:
        policy.rediscover()

    try:
        await serve_device_plugins(
            [server],
            rediscover,
            policy.watch_paths,
            stop,
            rescan_interval=rescan_interval,
            udev_subsystems=policy.scanner.udev_subsystems if real_host else (),
            health_files=policy.health_files,
            poll_interval=health_poll_interval,
            handover=handover,
        )
    finally:
        allocated.close()
        await handover.aclose()
        if handover.events is not None:
            await handover.events.drain()
        await client.aclose()
        if metrics_server is not None:
            metrics_server.shutdown()


def serve(paths: HostPaths, args: argparse.Namespace) -> Callable[[asyncio.Event], Awaitable[None]]:
    """``efa-device-plugin serve``: logs the start, then gives the daemon body."""
    log.info("starting", extra=kv(daemon=DAEMON_NAME, resource=RESOURCE_NAME, socket=SOCKET_NAME,
                                  rescan_interval=args.rescan_interval,
                                  health_poll_interval=args.health_poll_interval, **paths.describe()))

    async def main(stop: asyncio.Event) -> None:
        await run_plugin(paths, stop, rescan_interval=args.rescan_interval,
                         health_poll_interval=args.health_poll_interval, metrics_port=args.metrics_port,
                         metrics_address=args.metrics_address, node_name=args.node_name,
                         kubeconfig=args.kubeconfig)

    return main
