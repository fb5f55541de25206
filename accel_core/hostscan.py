"""The host side of one accelerator, shared by its device plugin and its DRA driver: a *host scanner*.

A scanner owns everything both daemons of an accelerator must agree on, so neither wires it on its own:

- ``scan(paths)``: read the host (called off the event loop) into a :class:`HostScan`: the inventory, each
  device's health under the accelerator's one health rule, and the host problems. Devices seen earlier stay in
  the inventory when they vanish, unhealthy (:class:`SeenDevices`, the one memory of them);
- ``watch_paths(paths, inventory)``: host paths whose changes start a rescan (a file stands for its directory);
  each daemon adds the directory its side of the coexistence guard reads;
- ``health_files(paths, inventory)``: the few files that carry health but raise no change event on real sysfs
  (port state, error counters), polled between rescans (:mod:`accel_core.healthpoll`);
- ``udev_subsystems``: the udev subsystems whose events start a rescan on a real host (:func:`udev_subsystems`);
- ``coexistence``: the one rule by which the device plugin and the DRA driver of the accelerator share a node
  (:class:`accel_core.coexistence.Coexistence`: the DRA driver wins);
- ``device_plugin_ids(inventory)``: each DRA device name with the device-plugin ``(resource, ID)`` pairs that are
  the same hardware, so each side can leave out what running pods of the other still hold.

The device-plugin policy keeps only resources and allocation; the DRA profile only slices, configs and container
edits. A new accelerator is a discovery module, a scanner, a small policy and a small profile.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Hashable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Generic, Protocol, TypeVar

from accel_core.coexistence import Coexistence
from accel_core.health import DeviceHealth
from accel_core.paths import HostPaths

InventoryT = TypeVar("InventoryT")
InventoryT_co = TypeVar("InventoryT_co", covariant=True)
K = TypeVar("K", bound=Hashable)
D = TypeVar("D")


@dataclass(frozen=True)
class HostScan(Generic[InventoryT]):
    """One look at an accelerator's host."""

    inventory: InventoryT
    """Devices seen earlier included (a vanished one is kept, unhealthy)."""
    health: Mapping[str, DeviceHealth] = field(default_factory=dict)
    """By the scanner's device key (the device plugin's ID where it has one per device), in inventory order."""
    problems: tuple[str, ...] = ()
    """Host problems, each naming its file or device."""
    new: tuple[str, ...] = ()
    """Keys of the devices seen for the first time in this scan."""
    summary: Mapping[str, object] = field(default_factory=dict)
    """Fields for the start-up log lines (instance type, topology...)."""


class HostScanner(Protocol[InventoryT]):
    """One accelerator's host side (see the module docstring)."""

    @property
    def udev_subsystems(self) -> tuple[str, ...]: ...

    @property
    def coexistence(self) -> Coexistence: ...

    def scan(self, paths: HostPaths) -> HostScan[InventoryT]: ...

    def watch_paths(self, paths: HostPaths, inventory: InventoryT) -> list[Path]: ...

    def health_files(self, paths: HostPaths, inventory: InventoryT) -> list[Path]: ...

    def device_plugin_ids(self, inventory: InventoryT) -> Mapping[str, tuple[tuple[str, str], ...]]: ...


def udev_subsystems(scanner: HostScanner[Any], paths: HostPaths) -> tuple[str, ...]:
    """The udev subsystems a daemon follows: the scanner's on a real host (host root ``/``, or a link to it); none
    on a fake tree, whose changes inotify sees (the machine's own udev events say nothing about it). The one place
    that decides."""
    return tuple(scanner.udev_subsystems) if os.path.realpath(paths.host_root) == "/" else ()


def held_dra_devices(ids: Mapping[str, tuple[tuple[str, str], ...]],
                     in_use: Mapping[str, set[str]]) -> frozenset[str]:
    """The DRA device names any of whose device-plugin IDs pods hold (``in_use``: resource -> IDs)."""
    return frozenset(name for name, pairs in ids.items() if any(i in in_use.get(r, ()) for r, i in pairs))


def held_device_plugin_ids(ids: Mapping[str, tuple[tuple[str, str], ...]],
                           dra_devices: Iterable[str]) -> dict[str, set[str]]:
    """resource -> the device-plugin IDs that are the same hardware as the given DRA devices."""
    out: dict[str, set[str]] = {}
    for name in dra_devices:
        for resource, device_id in ids.get(name, ()):
            out.setdefault(resource, set()).add(device_id)
    return out


class SeenDevices(Generic[K, D]):
    """Every device seen present since start, as it last was: one that vanishes stays listed (``vanished`` marks
    it unhealthy), so capacity does not silently shrink and its identity stays put until it is back.

    ``key`` names a device; ``present`` says whether a found device is really there (discovery may list a known
    device that is gone); ``restore(found, last)`` lets a device that is listed but not present keep what it had
    when it was (its PCI address, NUMA node).
    """

    def __init__(self, key: Callable[[D], K], *, present: Callable[[D], bool] = lambda _d: True,
                 vanished: Callable[[D], D] = lambda d: d,
                 restore: Callable[[D, D], D] | None = None) -> None:
        self._key = key
        self._present = present
        self._vanished = vanished
        self._restore = restore
        self._last: dict[K, D] = {}

    def keys(self) -> frozenset[K]:
        return frozenset(self._last)

    def update(self, found: Iterable[D]) -> tuple[list[D], list[D]]:
        """The devices found plus the vanished ones (sorted by key), and the devices present for the first time."""
        out: dict[K, D] = {}
        new: list[D] = []
        for dev in found:
            key = self._key(dev)
            last = self._last.get(key)
            if self._present(dev):
                if last is None:
                    new.append(dev)
                self._last[key] = dev
            elif last is not None and self._restore is not None:
                dev = self._restore(dev, last)
            out[key] = dev
        for key, last in self._last.items():
            if key not in out:
                out[key] = self._vanished(last)
        return [out[k] for k in sorted(out, key=_sort_key)], new


def _sort_key(key: Hashable) -> tuple[int, int, str]:
    """Numbers in numeric order, then strings."""
    return (0, key, "") if isinstance(key, int) else (1, 0, str(key))
