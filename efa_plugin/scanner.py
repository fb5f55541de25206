"""The EFA host scanner (:class:`accel_core.hostscan.HostScanner`), shared by the EFA device plugin and the EFA DRA
driver: discovery with the one EFA health rule, the devices seen earlier, what to watch and poll, and the
coexistence guard between ``aws-efa-device-plugin.sock`` and ``efa.aws.com``."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path

from accel_core.coexistence import Coexistence
from accel_core.hostscan import HostScan, SeenDevices
from accel_core.paths import HostPaths
from efa_plugin import COEXISTENCE, RESOURCE_NAME
from efa_plugin.discovery import CLASS_VERBS, DEV_IB, EfaDevice, EfaInventory, discover
from efa_plugin.health_rule import device_health, port_state_files, present, vanished

RDMA_CM = f"{DEV_IB}/rdma_cm"


class EfaScanner:
    """Reads the EFAs of a host and remembers every one seen (a vanished one stays, ``DeviceMissing``)."""

    udev_subsystems: tuple[str, ...] = ("infiniband", "infiniband_verbs")
    coexistence: Coexistence = COEXISTENCE

    def __init__(self, discover_fn: Callable[[HostPaths], EfaInventory] = discover) -> None:
        self._discover = discover_fn
        self._seen: SeenDevices[str, EfaDevice] = SeenDevices(lambda d: d.id, vanished=vanished)

    def scan(self, paths: HostPaths) -> HostScan[EfaInventory]:
        found = self._discover(paths)
        devices, new = self._seen.update(found.devices)
        inv = dataclasses.replace(found, devices=tuple(devices))
        return HostScan(inv, {d.id: device_health(d) for d in inv.devices},
                        (*inv.skipped, *(p for d in inv.devices for p in d.problems)), tuple(d.id for d in new),
                        {"instance_type": inv.instance_type or None, "ignored_rdma": len(inv.ignored)})

    def watch_paths(self, paths: HostPaths, inventory: EfaInventory) -> list[Path]:
        """As files, so the watcher watches just their directories: the verbs class (devices come and go),
        ``/dev/infiniband`` (device nodes) and each present device's port ``state``. A few dozen watches, not
        hundreds; anything else waits for the periodic rescan. Each daemon adds its side of the guard."""
        return [paths.host(f"{CLASS_VERBS}/abi_version"), paths.host(RDMA_CM), *self.health_files(paths, inventory)]

    def device_plugin_ids(self, inventory: EfaInventory) -> dict[str, tuple[tuple[str, str], ...]]:
        """Each EFA's DRA device name with its one ``vpc.amazonaws.com/efa`` ID."""
        from efa_plugin.dra.names import device_name

        return {device_name(d): ((RESOURCE_NAME, d.id),) for d in inventory.devices}

    def health_files(self, paths: HostPaths, inventory: EfaInventory) -> list[Path]:
        """Each present device's port ``state`` files: real sysfs raises no event when a port goes DOWN."""
        return port_state_files(d for d in inventory.devices if present(d))
