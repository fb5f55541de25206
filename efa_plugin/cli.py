"""``efa-device-plugin``: the EFA device-plugin daemon (``serve``) and a read-only inventory view (``ls``).

    efa-device-plugin serve [--host-root DIR] [--kubelet-root DIR] [--metrics-port 9810] [--rescan-interval 60]
                            [--health-poll-interval 0.75]
    efa-device-plugin ls [--host-root DIR] [--output table|json]

``serve`` never exits for a node without EFA: it logs one line, advertises nothing, keeps watching and registers
once devices appear. SIGTERM, SIGINT and SIGHUP stop it cleanly (socket removed, exit status 0).

Start-up registers first: this module imports only what serving and registering need; the scan, the policy,
metrics and the watchers load once the kubelet has the registration (:func:`run_plugin`).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING

from accel_core.cli import EnvArgumentParser, add_common_flags, seconds, setup_from_args
from accel_core.daemon import catch_stop_signals, run_daemon
from accel_core.deviceplugin.server import DevicePluginServer, register_first
from accel_core.logs import kv
from accel_core.paths import HostPaths
from efa_plugin import METRICS_PORT, RESOURCE_NAME, SOCKET_NAME
from efa_plugin.presence import efa_expected

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry

    from efa_plugin.discovery import EfaInventory

log = logging.getLogger("efa_plugin")

DAEMON_NAME = "efa-device-plugin"
#: a full rescan of 32 devices costs ~5 ms of CPU: on inotify/udev events, on a port-state change the health poll
#: sees, and on this slow safety interval only (an idle daemon pays it on every node)
DEFAULT_RESCAN_S = 60.0
#: each poll of the 32 port-state files wakes the daemon (~0.2 ms); every 0.75 s keeps a port change on a real node
#: (no sysfs event) under 1 s from the kubelet, for 2/3 of the wake-ups 0.5 s cost
DEFAULT_HEALTH_POLL_S = 0.75


def build_parser() -> EnvArgumentParser:
    parser = EnvArgumentParser(prog=DAEMON_NAME, description="Kubernetes device plugin for AWS EFA "
                               f"({RESOURCE_NAME}).")
    sub = parser.add_subparsers(dest="command", required=True)
    serve = sub.add_parser("serve", help="run the device plugin")
    add_common_flags(serve, metrics_port=METRICS_PORT)
    serve.add_env_argument("--rescan-interval", env="EFA_RESCAN_INTERVAL", type=seconds, default=DEFAULT_RESCAN_S,
                           help="seconds between full host rescans besides those inotify/udev events start "
                                f"(env EFA_RESCAN_INTERVAL; default {DEFAULT_RESCAN_S})")
    serve.add_env_argument("--health-poll-interval", env="EFA_HEALTH_POLL_INTERVAL", type=seconds,
                           default=DEFAULT_HEALTH_POLL_S,
                           help="seconds between reads of the ports' state files; port state has no change event "
                                "on real sysfs, so this bounds how fast a port going DOWN is seen (env "
                                f"EFA_HEALTH_POLL_INTERVAL; default {DEFAULT_HEALTH_POLL_S})")
    ls = sub.add_parser("ls", help="print the EFA devices of this host and exit")
    add_common_flags(ls)
    ls.add_argument("--output", "-o", choices=("table", "json"), default="table")
    return parser


# ------------------------------------------------------------------------------------------------ ls


def inventory_json(inv: EfaInventory) -> dict[str, object]:
    """The ``ls --output json`` document."""
    return {
        "resources": {RESOURCE_NAME: len(inv.devices)},
        "healthy": sum(d.healthy for d in inv.devices),
        "instance_type": inv.instance_type,
        "devices": [d.as_dict() for d in inv.devices],
        "ignored": [{"ibdev": i.ibdev, "uverbs": i.uverbs, "pci_address": i.pci_address, "reason": i.reason}
                    for i in inv.ignored],
        "skipped": list(inv.skipped),
    }


def inventory_table(inv: EfaInventory) -> str:
    """The default ``ls`` output: one row per EFA, then ignored RDMA devices and problems."""
    header = ("ID", "IBDEV", "NODE", "NUMA", "PCIE-ROOT", "PORT", "HEALTH", "NEAR")
    rows = [header]
    for d in inv.devices:
        near = ",".join(d.near_gpus) or ",".join(f"neuron{n}" for n in d.near_neurons) or "-"
        rows.append((d.id, d.ibdev, d.device_node, "-" if d.numa_node is None else str(d.numa_node),
                     d.pcie_root or "-", d.port_state or "-", "Healthy" if d.healthy else "Unhealthy", near))
    widths = [max(len(r[i]) for r in rows) for i in range(len(header))]
    lines = [f"{RESOURCE_NAME}: {len(inv.devices)} ({sum(d.healthy for d in inv.devices)} healthy)"
             f"  instance type: {inv.instance_type or 'unknown'}"]
    if inv.devices:
        lines += ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows]
    for d in inv.devices:
        lines += [f"problem: {d.id} ({d.ibdev}): {p}" for p in d.problems]
    lines += [f"ignored: {i.ibdev} ({i.uverbs}, {i.pci_address}): {i.reason}" for i in inv.ignored]
    lines += [f"skipped: {s}" for s in inv.skipped]
    return "\n".join(lines)


def _ls(args: argparse.Namespace) -> int:
    from efa_plugin.discovery import discover

    paths = setup_from_args(args, serving=False)
    inv = discover(paths)
    if args.output == "json":
        print(json.dumps(inventory_json(inv), indent=2))
    else:
        print(inventory_table(inv))
    return 0


# ------------------------------------------------------------------------------------------------ serve


async def run_plugin(paths: HostPaths, stop: asyncio.Event, *, registry: CollectorRegistry | None = None,
                     rescan_interval: float = DEFAULT_RESCAN_S, retry_interval: float = 1.0,
                     health_poll_interval: float = DEFAULT_HEALTH_POLL_S, metrics_port: int = 0,
                     metrics_address: str = "127.0.0.1") -> None:
    """The daemon body: serve and register, then discover, follow host changes until ``stop``.

    Also used by the component tests and the benchmark, so they exercise exactly this wiring.
    """
    server = DevicePluginServer(None, paths, resource_name=RESOURCE_NAME, socket_name=SOCKET_NAME,
                                expect_devices=lambda: efa_expected(paths), retry_interval=retry_interval)
    await register_first([server], stop)
    # the kubelet knows us (or there is nothing to register yet): load the rest now
    from prometheus_client import CollectorRegistry

    from accel_core.deviceplugin.runner import serve_device_plugins
    from accel_core.metrics import CallbackCollector, serve_metrics
    from efa_plugin.metrics import AllocatedDevices, EfaMetrics
    from efa_plugin.policy import EfaPolicy

    registry = registry if registry is not None else CollectorRegistry()
    policy = EfaPolicy(paths)
    await asyncio.to_thread(policy.rediscover)  # off the loop: the kubelet may be calling us already
    allocated = AllocatedDevices(paths.pod_resources_socket, RESOURCE_NAME)
    registry.register(CallbackCollector(EfaMetrics(policy, allocated)))
    metrics_server = serve_metrics(registry, metrics_port, metrics_address)
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
        )
    finally:
        allocated.close()
        if metrics_server is not None:
            metrics_server.shutdown()


def _serve(args: argparse.Namespace) -> int:
    catch_stop_signals()
    paths = setup_from_args(args)
    log.info("starting", extra=kv(daemon=DAEMON_NAME, resource=RESOURCE_NAME, socket=SOCKET_NAME,
                                  rescan_interval=args.rescan_interval,
                                  health_poll_interval=args.health_poll_interval, **paths.describe()))

    async def main(stop: asyncio.Event) -> None:
        await run_plugin(paths, stop, rescan_interval=args.rescan_interval,
                         health_poll_interval=args.health_poll_interval, metrics_port=args.metrics_port,
                         metrics_address=args.metrics_address)

    return run_daemon(main, DAEMON_NAME)


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "ls":
        return _ls(args)
    return _serve(args)


if __name__ == "__main__":
    sys.exit(main())
