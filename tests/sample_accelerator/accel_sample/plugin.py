"""``sample-device-plugin serve``: ``example.com/sacc`` on the sample scanner; a container gets its devices'
``/dev/saccN`` and ``SACC_VISIBLE_DEVICES``."""

from __future__ import annotations

import asyncio
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from prometheus_client import CollectorRegistry

from accel_core.cli import EnvArgumentParser, add_common_flags, setup_from_args
from accel_core.daemon import run_daemon
from accel_core.deviceplugin.policy import AdvertisedDevice, AllocationError
from accel_core.deviceplugin.runner import serve_device_plugins
from accel_core.deviceplugin.server import DevicePluginServer
from accel_core.edits import ContainerEdits, DeviceNode
from accel_core.metrics import serve_metrics
from accel_core.paths import HostPaths
from accel_sample import PLUGIN, RESOURCE, SOCKET
from accel_sample.scanner import Sacc, SaccScanner


class SaccPolicy:
    resource_name = RESOURCE
    socket_name = SOCKET

    def __init__(self, paths: HostPaths) -> None:
        self.paths, self.scanner = paths, SaccScanner()
        self.inventory: tuple[Sacc, ...] = ()

    def rediscover(self) -> None:
        self.inventory = self.scanner.scan(self.paths).inventory

    def watch_paths(self) -> list[Path]:
        return self.scanner.watch_paths(self.paths, self.inventory)

    def health_files(self) -> list[Path]:
        return self.scanner.health_files(self.paths, self.inventory)

    def devices(self) -> list[AdvertisedDevice]:
        return [AdvertisedDevice(d.id, d.health.healthy, d.numa) for d in self.inventory]

    def advertise_blocked(self) -> str | None:
        return self.scanner.coexistence.device_plugin_blocked(self.paths)

    def preferred(self, available: Sequence[str], must_include: Sequence[str], size: int) -> list[str]:
        return list(dict.fromkeys([*must_include, *available]))[:size]

    def allocate(self, ids: Sequence[str]) -> ContainerEdits:
        by_id = {d.id: d for d in self.inventory}
        bad = [i for i in ids if i not in by_id or not by_id[i].health.healthy]
        if bad:
            raise AllocationError(f"sacc devices {bad} are unknown or unhealthy")
        devs = [by_id[i] for i in ids]
        return ContainerEdits(device_nodes=tuple(DeviceNode(d.node, major=d.major, minor=d.minor) for d in devs),
                              env=(("SACC_VISIBLE_DEVICES", ",".join(str(d.index) for d in devs)),))


async def run(paths: HostPaths, stop: asyncio.Event, rescan: float, registry: CollectorRegistry) -> None:
    policy = SaccPolicy(paths)
    await asyncio.to_thread(policy.rediscover)
    udev = policy.scanner.udev_subsystems if os.path.realpath(paths.host_root) == "/" else ()
    server = DevicePluginServer(policy, paths, registry=registry)
    await serve_device_plugins([server], policy.rediscover, policy.watch_paths, stop,
                               rescan_interval=rescan, udev_subsystems=udev, health_files=policy.health_files,
                               poll_interval=0.5)


def main(argv: Sequence[str] | None = None) -> int:
    parser = EnvArgumentParser(prog=PLUGIN.script, description=f"device plugin for {RESOURCE}")
    serve = parser.add_subparsers(dest="command", required=True).add_parser("serve")
    add_common_flags(serve, metrics_port=PLUGIN.metrics_port)
    serve.add_argument("--rescan-interval", type=float, default=60.0)
    args = parser.parse_args(argv)
    paths = setup_from_args(args)
    registry = CollectorRegistry()
    serve_metrics(registry, args.metrics_port, args.metrics_address)
    return run_daemon(lambda stop: run(paths, stop, args.rescan_interval, registry), PLUGIN.script)


if __name__ == "__main__":
    sys.exit(main())
