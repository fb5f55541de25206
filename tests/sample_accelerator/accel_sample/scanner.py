"""Discovery and the host scanner both sample daemons share: devices with health, seen-devices memory, what to
watch and poll, and the coexistence rule."""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from pathlib import Path

from accel_core.coexistence import Coexistence
from accel_core.health import HEALTHY, DeviceHealth
from accel_core.hostfiles import HostValueError, parse_index, parse_int, read_attr, read_label
from accel_core.hostscan import HostScan, SeenDevices
from accel_core.paths import HostPaths
from accel_sample import DRIVER, RESOURCE, SOCKET

CLASS = "/sys/class/sample_accel"


@dataclass(frozen=True)
class Sacc:
    index: int
    major: int
    minor: int
    numa: int | None
    model: str
    health: DeviceHealth = HEALTHY

    @property
    def id(self) -> str:
        return f"sacc{self.index}"

    @property
    def node(self) -> str:
        return f"/dev/sacc{self.index}"


def discover(paths: HostPaths) -> tuple[list[Sacc], list[str]]:
    """The devices under the class directory and the problems (each naming its file)."""
    found, problems = [], []
    try:
        names = sorted(os.listdir(paths.host(CLASS)))
    except OSError:
        return [], []
    for name in names:
        index = parse_index(name, "sacc")
        if index is None:
            continue
        base = paths.host(f"{CLASS}/{name}")
        try:
            major, _, minor = read_attr(f"{base}/dev", f"{CLASS}/{name}/dev").partition(":")
            state = read_label(f"{base}/health", f"{CLASS}/{name}/health")
            numa = parse_int(read_attr(f"{base}/numa_node"), f"{CLASS}/{name}/numa_node")
            dev = Sacc(index, parse_int(major, f"{CLASS}/{name}/dev"), parse_int(minor, f"{CLASS}/{name}/dev"),
                       numa, read_label(f"{base}/model"))
        except HostValueError as exc:
            problems.append(str(exc))
            continue
        if state != "ok":
            dev = dataclasses.replace(dev, health=DeviceHealth(False, "Fault", f"{CLASS}/{name}/health: {state}"))
        elif not os.path.exists(paths.host(dev.node)):
            dev = dataclasses.replace(dev, health=DeviceHealth(False, "DeviceNodeMissing", f"{dev.node} missing"))
        found.append(dev)
    return found, problems


def _vanished(dev: Sacc) -> Sacc:
    return dataclasses.replace(dev, health=DeviceHealth(False, "DeviceMissing", f"{dev.id} is gone from {CLASS}"))


class SaccScanner:
    udev_subsystems: tuple[str, ...] = ("sample_accel",)
    coexistence: Coexistence = Coexistence("sample", (SOCKET,), DRIVER, (RESOURCE,))

    def __init__(self) -> None:
        self._seen: SeenDevices[int, Sacc] = SeenDevices(lambda d: d.index, vanished=_vanished)

    def scan(self, paths: HostPaths) -> HostScan[tuple[Sacc, ...]]:
        found, problems = discover(paths)
        devices, new = self._seen.update(found)
        return HostScan(tuple(devices), {d.id: d.health for d in devices}, tuple(problems), tuple(d.id for d in new))

    def watch_paths(self, paths: HostPaths, inventory: tuple[Sacc, ...]) -> list[Path]:
        return [paths.host(f"{CLASS}/x"), paths.host("/dev/sacc0"), *self.health_files(paths, inventory)]

    def device_plugin_ids(self, inventory: tuple[Sacc, ...]) -> dict[str, tuple[tuple[str, str], ...]]:
        return {d.id: ((RESOURCE, d.id),) for d in inventory}  # one name on both sides

    def health_files(self, paths: HostPaths, inventory: tuple[Sacc, ...]) -> list[Path]:
        return [paths.host(f"{CLASS}/{d.id}/health") for d in inventory if d.health.reason != "DeviceMissing"]
