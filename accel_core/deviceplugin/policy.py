"""The seams a device plugin implements: one policy per extended resource, and a profile (the host scanner and
its policies) that :class:`accel_core.deviceplugin.daemon.DevicePluginService` drives."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from accel_core.edits import ContainerEdits
from accel_core.hostscan import HostScan, HostScanner, InventoryT


@dataclass(frozen=True)
class AdvertisedDevice:
    """One device as the kubelet sees it: an ID (at most 63 characters), health, and NUMA node if known."""

    id: str
    healthy: bool = True
    numa_node: int | None = None


class AllocationError(Exception):
    """Allocate or preferred allocation got IDs it cannot serve; the message names them (INVALID_ARGUMENT)."""


class DevicePluginPolicy(Protocol):
    """What a driver provides; everything about sockets, streams and the kubelet lives in the server."""

    @property
    def resource_name(self) -> str: ...

    @property
    def socket_name(self) -> str: ...

    def devices(self) -> Sequence[AdvertisedDevice]:
        """The full current device list (called on start and after every change)."""
        ...

    def advertise_blocked(self) -> str | None:
        """A reason to advertise nothing right now (e.g. a conflicting driver), or None."""
        ...

    def preferred(self, available: Sequence[str], must_include: Sequence[str], size: int) -> list[str]:
        """Preferred IDs for one container: must include ``must_include``, exactly ``size`` long if possible."""
        ...

    def allocate(self, ids: Sequence[str]) -> ContainerEdits:
        """Edits for one container getting ``ids``; raise AllocationError naming a bad ID."""
        ...


class DevicePluginProfile(Protocol[InventoryT]):
    """What an accelerator's device plugin is once loaded; subclass it to inherit the optional :meth:`start`."""

    scanner: HostScanner[InventoryT]
    policies: Sequence[DevicePluginPolicy]
    """One per registration, in the declaration's order."""

    def update(self, scan: HostScan[InventoryT]) -> None:
        """Take a new scan (on the event loop): inventory and health come from it, nowhere else."""
        ...

    async def start(self, stop: asyncio.Event) -> Sequence[asyncio.Task[None]]:
        """Once the first scan is in, before the servers advertise: learn what the node holds; returns tasks that
        run beside the watcher until ``stop`` (awaited at shutdown)."""
        return ()
