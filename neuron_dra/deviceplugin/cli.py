"""``neuron-device-plugin``: ``serve`` (the kubelet device plugin) and ``ls`` (what it would advertise).

``serve`` registers first: this module loads only what serving and registering need; the scan, the instance
catalog, the policies, metrics and the rest load once the kubelet has both registrations (daemon.py).
"""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import Sequence

from accel_core.cli import (
    EnvArgumentParser,
    add_common_flags,
    add_logging_flags,
    node_name,
    safe_stdout,
    seconds,
    seconds_or_zero,
    setup_from_args,
)
from accel_core.daemon import catch_stop_signals, run_daemon
from accel_core.deviceplugin.server import DevicePluginServer, register_first
from accel_core.logs import setup_logging
from accel_core.paths import ENV_NODE_NAME, HostPaths, add_path_flags, resolve_paths
from neuron_dra import COEXISTENCE
from neuron_dra.accelerator import DEVICE_PLUGIN
from neuron_dra.deviceplugin.options import DEFAULT_HEALTH_POLL_S, DEFAULT_RESCAN_S, REGISTRATIONS, ServeOptions
from neuron_dra.presence import devices_present
from neuron_dra.runtime_env import CORE_NUMBERING_FLAG

METRICS_PORT = DEVICE_PLUGIN.metrics_port


def build_parser() -> EnvArgumentParser:
    parser = EnvArgumentParser(prog="neuron-device-plugin",
                               description="Kubernetes device plugin for AWS Neuron devices and NeuronCores")
    sub = parser.add_subparsers(dest="command", required=True)
    srv = sub.add_parser("serve", help="serve aws.amazon.com/neuron and aws.amazon.com/neuroncore to the kubelet")
    add_common_flags(srv, metrics_port=METRICS_PORT)
    srv.add_env_argument("--rescan-interval", env="RESCAN_INTERVAL", type=seconds, default=DEFAULT_RESCAN_S,
                         help="seconds between full host rescans besides those inotify/udev events and the health "
                              f"poll start: a safety net (env RESCAN_INTERVAL; default {DEFAULT_RESCAN_S:g})")
    srv.add_env_argument("--health-poll-interval", env="HEALTH_POLL_INTERVAL", type=seconds,
                         default=DEFAULT_HEALTH_POLL_S,
                         help="seconds between reads of the uncorrected-error counters, which raise no change "
                              f"event on sysfs (env HEALTH_POLL_INTERVAL; default {DEFAULT_HEALTH_POLL_S:g})")
    srv.add_env_argument("--pod-resources-interval", env="POD_RESOURCES_INTERVAL", type=seconds, default=2.0,
                         help="seconds between PodResources List calls while devices are held or pending "
                              "(env POD_RESOURCES_INTERVAL; default 2)")
    srv.add_env_argument("--pod-resources-idle-interval", env="POD_RESOURCES_IDLE_INTERVAL", type=seconds,
                         default=30.0,
                         help="seconds between PodResources List calls while no device is held or pending; an "
                              "Allocate ends the wait (env POD_RESOURCES_IDLE_INTERVAL; default 30)")
    srv.add_env_argument("--allocation-grace", env="ALLOCATION_GRACE", type=seconds_or_zero, default=30.0,
                         help="seconds an Allocate stays in use without PodResources confirming it "
                              "(env ALLOCATION_GRACE; default 30)")
    CORE_NUMBERING_FLAG.add_to(srv)
    srv.add_env_argument("--node-name", env=ENV_NODE_NAME, type=node_name, default=None,
                         help="this node's name, for the UltraServer labels on its Node (env NODE_NAME)")
    srv.add_argument("--kubeconfig", default=None,
                     help="kubeconfig for the Node labels (default: KUBECONFIG, then in-cluster; none: no labels)")
    ls = sub.add_parser("ls", help="print the Neuron devices and the resource counts the plugin would advertise")
    add_path_flags(ls)
    ls.add_argument("--output", "-o", choices=["table", "json"], default="table")
    add_logging_flags(ls, level="WARNING")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "ls":
        from neuron_dra.deviceplugin.listing import inventory_report, inventory_table
        from neuron_dra.discovery import discover

        setup_logging(args.log_level, args.log_format)
        safe_stdout()
        paths = resolve_paths(args)
        inv = discover(paths)
        blocked = COEXISTENCE.device_plugin_blocked(paths)
        if args.output == "json":
            print(json.dumps(inventory_report(inv, blocked), indent=2))
        else:
            print(inventory_table(inv, blocked))
        return 0
    catch_stop_signals()
    paths = setup_from_args(args)
    options = ServeOptions(
        rescan_interval=max(0.05, args.rescan_interval),
        health_poll_interval=max(0.05, args.health_poll_interval),
        pod_resources_interval=max(0.05, args.pod_resources_interval),
        pod_resources_idle_interval=max(0.05, args.pod_resources_idle_interval),
        allocation_grace=max(0.0, args.allocation_grace),
        core_numbering=args.core_numbering,
        metrics_port=args.metrics_port,
        metrics_address=args.metrics_address,
        node_name=args.node_name,
        kubeconfig=args.kubeconfig,
    )
    return run_daemon(lambda stop: serve_registering_first(paths, options, stop), "neuron-device-plugin")


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


if __name__ == "__main__":
    sys.exit(main())
