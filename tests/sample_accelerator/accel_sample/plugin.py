"""``sample-device-plugin serve``: ``example.com/sacc`` on the sample scanner; a container gets its devices'
``/dev/saccN`` and ``SACC_VISIBLE_DEVICES``."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path

from prometheus_client import CollectorRegistry

from accel_core.deviceplugin.cli import DevicePluginCli
from accel_core.deviceplugin.pluginserver import DevicePluginServer
from accel_core.deviceplugin.policy import AdvertisedDevice, AllocationError
from accel_core.deviceplugin.runner import serve_device_plugins
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
        return [*self.scanner.watch_paths(self.paths, self.inventory),
                *self.scanner.coexistence.device_plugin_watch_paths(self.paths)]

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
        devs = sorted((by_id[i] for i in ids), key=lambda d: d.index)  # the kubelet's ids come in any order
        return ContainerEdits(device_nodes=tuple(DeviceNode(d.node, major=d.major, minor=d.minor) for d in devs),
                              env=(("SACC_VISIBLE_DEVICES", ",".join(str(d.index) for d in devs)),))


def serve(paths: HostPaths, args: argparse.Namespace) -> Callable[[asyncio.Event], Awaitable[None]]:
    registry = CollectorRegistry()
    serve_metrics(registry, args.metrics_port, args.metrics_address)

    async def main(stop: asyncio.Event) -> None:
        policy = SaccPolicy(paths)
        await asyncio.to_thread(policy.rediscover)
        udev = policy.scanner.udev_subsystems if os.path.realpath(paths.host_root) == "/" else ()
        await serve_device_plugins([DevicePluginServer(policy, paths, registry=registry)], policy.rediscover,
                                   policy.watch_paths, stop, rescan_interval=args.rescan_interval,
                                   udev_subsystems=udev, health_files=policy.health_files,
                                   poll_interval=args.health_poll_interval)
    return main


def ls(paths: HostPaths, args: argparse.Namespace) -> str:
    policy = SaccPolicy(paths)
    policy.rediscover()
    rows = [{"id": d.id, "healthy": d.health.healthy, "numa": d.numa} for d in policy.inventory]
    return json.dumps(rows) if args.output == "json" else "\n".join(f"{r['id']} {r['healthy']}" for r in rows)


CLI = DevicePluginCli(prog=PLUGIN.script, description=f"device plugin for {RESOURCE}", metrics_port=PLUGIN.metrics_port,
                      serve=serve, ls=ls, rescan_env="RESCAN_INTERVAL", rescan_default=60.0,
                      health_poll_env="HEALTH_POLL_INTERVAL", health_poll_default=0.5, health_files="the health files")
main = CLI.main

if __name__ == "__main__":
    CLI.run()
