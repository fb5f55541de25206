"""``sample-device-plugin serve``: ``example.com/sacc`` on the sample scanner; a container gets its devices'
``/dev/saccN`` and ``SACC_VISIBLE_DEVICES``."""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence

from accel_core.deviceplugin.cli import DevicePluginCli
from accel_core.deviceplugin.daemon import DevicePluginDaemon, serving
from accel_core.deviceplugin.policy import AdvertisedDevice, AllocationError, DevicePluginProfile
from accel_core.edits import ContainerEdits, DeviceNode
from accel_core.health import HEALTHY, DeviceHealth
from accel_core.hostscan import HostScan
from accel_core.paths import HostPaths
from accel_sample import PLUGIN, RESOURCE, SOCKET
from accel_sample.scanner import Sacc, SaccScanner


class SaccPolicy(DevicePluginProfile[tuple[Sacc, ...]]):
    resource_name = RESOURCE
    socket_name = SOCKET

    def __init__(self, paths: HostPaths) -> None:
        self.paths, self.scanner, self.policies = paths, SaccScanner(), (self,)
        self.inventory: tuple[Sacc, ...] = ()
        self.health: dict[str, DeviceHealth] = {}

    def update(self, scan: HostScan[tuple[Sacc, ...]]) -> None:
        self.inventory, self.health = scan.inventory, dict(scan.health)

    def healthy(self, device_id: str) -> bool:
        return self.health.get(device_id, HEALTHY).healthy

    def devices(self) -> list[AdvertisedDevice]:
        return [AdvertisedDevice(d.id, self.healthy(d.id), d.numa) for d in self.inventory]

    def advertise_blocked(self) -> str | None:
        return self.scanner.coexistence.device_plugin_blocked(self.paths)

    def preferred(self, available: Sequence[str], must_include: Sequence[str], size: int) -> list[str]:
        return list(dict.fromkeys([*must_include, *available]))[:size]

    def allocate(self, ids: Sequence[str]) -> ContainerEdits:
        by_id = {d.id: d for d in self.inventory}
        bad = [i for i in ids if i not in by_id or not self.healthy(i)]
        if bad:
            raise AllocationError(f"sacc devices {bad} are unknown or unhealthy")
        devs = sorted((by_id[i] for i in ids), key=lambda d: d.index)  # the kubelet's ids come in any order
        return ContainerEdits(device_nodes=tuple(DeviceNode(d.node, major=d.major, minor=d.minor) for d in devs),
                              env=(("SACC_VISIBLE_DEVICES", ",".join(str(d.index) for d in devs)),))


def ls(paths: HostPaths, args: argparse.Namespace) -> str:
    policy = SaccPolicy(paths)
    policy.update(policy.scanner.scan(paths))
    rows = [{"id": d.id, "healthy": policy.healthy(d.id), "numa": d.numa} for d in policy.inventory]
    return json.dumps(rows) if args.output == "json" else "\n".join(f"{r['id']} {r['healthy']}" for r in rows)


DAEMON = DevicePluginDaemon(PLUGIN.script, ((RESOURCE, SOCKET),), SaccScanner.coexistence,
                            lambda service: SaccPolicy(service.paths))
CLI = DevicePluginCli(prog=PLUGIN.script, description=f"device plugin for {RESOURCE}", metrics_port=PLUGIN.metrics_port,
                      serve=serving(DAEMON), ls=ls, rescan_env="RESCAN_INTERVAL", rescan_default=60.0,
                      health_poll_env="HEALTH_POLL_INTERVAL", health_poll_default=0.5, health_files="the health files")
main = CLI.main

if __name__ == "__main__":
    CLI.run()
