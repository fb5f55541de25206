"""``neuron-device-plugin serve`` up to the first Register: both servers registered before the daemon (daemon.py),
its scan, catalog, policies and metrics load. Light: only what serving and registering need."""

from __future__ import annotations

import argparse
import asyncio
from collections.abc import Awaitable, Callable

from accel_core.deviceplugin.pluginserver import DevicePluginServer, register_first
from accel_core.paths import HostPaths
from neuron_dra import COEXISTENCE
from neuron_dra.deviceplugin.options import REGISTRATIONS, ServeOptions
from neuron_dra.presence import devices_present


def serve(paths: HostPaths, args: argparse.Namespace) -> Callable[[asyncio.Event], Awaitable[None]]:
    """The daemon body for ``serve``'s flags."""
    options = ServeOptions.from_args(args)
    return lambda stop: serve_registering_first(paths, options, stop)


def early_servers(paths: HostPaths, options: ServeOptions) -> list[DevicePluginServer]:
    """Both servers, without policies yet: they register when this node shows Neuron devices and no DRA driver."""

    def expected() -> bool:
        return devices_present(paths) and COEXISTENCE.device_plugin_blocked(paths) is None

    return [DevicePluginServer(None, paths, resource_name=resource, socket_name=socket, expect_devices=expected,
                               retry_interval=options.retry_interval) for resource, socket in REGISTRATIONS]


async def serve_registering_first(paths: HostPaths, options: ServeOptions, stop: asyncio.Event,
                                  servers: list[DevicePluginServer] | None = None) -> None:
    """Serve both sockets and register them (:func:`early_servers`), then load and run the daemon, which gives
    both servers their policies."""
    servers = servers if servers is not None else early_servers(paths, options)
    await register_first(servers, stop)
    from neuron_dra.deviceplugin.daemon import serve

    await serve(paths, options, stop, servers=servers)
