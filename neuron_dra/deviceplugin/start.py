"""``neuron-device-plugin serve``, declared: both registrations serve and register before the daemon (daemon.py),
its scan, catalog, policies and metrics load. Light: only what serving and registering need."""

from __future__ import annotations

import argparse
import asyncio
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

from accel_core.deviceplugin.daemon import DevicePluginDaemon, DevicePluginService
from accel_core.paths import HostPaths
from neuron_dra import COEXISTENCE
from neuron_dra.deviceplugin.options import REGISTRATIONS, ServeOptions
from neuron_dra.presence import devices_present

if TYPE_CHECKING:
    from neuron_dra.deviceplugin.daemon import NeuronPlugin

DAEMON_NAME = "neuron-device-plugin"


def plugin(options: ServeOptions) -> DevicePluginDaemon:
    """The declaration for ``options``."""

    def load(service: DevicePluginService) -> NeuronPlugin:
        from neuron_dra.deviceplugin.daemon import NeuronPlugin

        return NeuronPlugin(service, options)

    return DevicePluginDaemon(DAEMON_NAME, REGISTRATIONS, COEXISTENCE, load, probe=devices_present)


def service(paths: HostPaths, options: ServeOptions) -> DevicePluginService:
    """The device plugin for ``options``, ready to ``run``."""
    return DevicePluginService(plugin(options), paths, rescan_interval=options.rescan_interval,
                               health_poll_interval=options.health_poll_interval, metrics_port=options.metrics_port,
                               metrics_address=options.metrics_address, node_name=options.node_name,
                               kubeconfig=options.kubeconfig, retry_interval=options.retry_interval)


def serve(paths: HostPaths, args: argparse.Namespace) -> Callable[[asyncio.Event], Awaitable[None]]:
    """The daemon body for ``serve``'s flags."""
    return service(paths, ServeOptions.from_args(args)).run
