"""The EFA device-plugin policy: what ``vpc.amazonaws.com/efa`` advertises, prefers and hands to a container.

It keeps the inventory and health of the latest scan of the EFA host scanner (:mod:`efa_plugin.scanner`, shared
with the DRA driver), which the device-plugin service hands it on every host change. The scanner remembers every
device it has seen: a device whose sysfs entry vanishes stays advertised as Unhealthy until it comes back, so the
node's capacity does not silently shrink and nothing is scheduled onto it.

Allocate gives one DeviceSpec per device, ``/dev/infiniband/uverbsN`` with ``rw``, and nothing else: no hostPath of
``/dev/infiniband`` (which would expose non-EFA uverbs, umad and issm nodes), no ``rdma_cm`` (EFA does not use it).
While the EFA DRA driver (``efa.aws.com``) is registered on the node, nothing is advertised.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable, Mapping, Sequence

from accel_core.deviceplugin.policy import AdvertisedDevice, AllocationError, DevicePluginProfile
from accel_core.edits import ContainerEdits, DeviceNode
from accel_core.health import HEALTHY, DeviceHealth
from accel_core.hostscan import HostScan
from accel_core.logs import ProblemLog, kv
from accel_core.paths import HostPaths
from efa_plugin import RESOURCE_NAME, SOCKET_NAME
from efa_plugin.allocation import Topology
from efa_plugin.discovery import CLASS_VERBS, EfaInventory, discover
from efa_plugin.scanner import EfaScanner

log = logging.getLogger(__name__)


class EfaPolicy(DevicePluginProfile[EfaInventory]):
    """DevicePluginPolicy for EFA, and the plugin's profile (:mod:`accel_core.deviceplugin.daemon`). Readers in
    other threads (metrics) are safe: the state is replaced whole."""

    resource_name = RESOURCE_NAME
    socket_name = SOCKET_NAME

    def __init__(self, paths: HostPaths, *, discover_fn: Callable[[HostPaths], EfaInventory] = discover,
                 scanner: EfaScanner | None = None) -> None:
        self.paths = paths
        self.scanner = scanner if scanner is not None else EfaScanner(discover_fn)
        self.policies = (self,)
        #: inventory, health by device ID and topology, replaced together (a metrics scrape reads them in its thread)
        self._state: tuple[EfaInventory, Mapping[str, DeviceHealth], Topology] = (EfaInventory(), {}, Topology(()))
        self._problems = ProblemLog(log, "EFA device unhealthy", "EFA problem cleared",
                                    appeared_without_subject="EFA entry skipped")
        self._announced_empty = False
        self.allocation_counts: Counter[str] = Counter()  #: times each device was handed out by Allocate

    # -- state ---------------------------------------------------------------------------------------------------
    @property
    def inventory(self) -> EfaInventory:
        """The current inventory, vanished devices included (as Unhealthy)."""
        return self._state[0]

    @property
    def topology(self) -> Topology:
        return self._state[2]

    def snapshot(self) -> tuple[EfaInventory, Mapping[str, DeviceHealth]]:
        """The inventory and the health by device ID of one scan (for readers in other threads)."""
        return self._state[0], self._state[1]

    def health(self, device_id: str) -> DeviceHealth:
        """The device's health as the latest scan said (the one EFA rule)."""
        return self._state[1].get(device_id, HEALTHY)

    def rediscover(self) -> bool:
        """Scan the host here and take the scan; returns True when the inventory changed (tests, ``ls``)."""
        before = self.inventory
        self.update(self.scanner.scan(self.paths))
        return self.inventory is not before

    def update(self, scan: HostScan[EfaInventory]) -> None:
        """Take a host scan: inventory and health; log what changed (once per problem)."""
        inventory, new = scan.inventory, set(scan.new)
        for dev in inventory.devices:
            if dev.id in new:
                log.info("EFA device found", extra=kv(device=dev.ibdev, uverbs=dev.uverbs, pci=dev.pci_address,
                                                      numa=dev.numa_node, pcie_root=dev.pcie_root,
                                                      port=dev.port_state))
        self._report(inventory)
        old, _, topology = self._state
        if inventory == old:
            self._state = (old, scan.health, topology)
        else:
            self._state = (inventory, scan.health, Topology(inventory.devices))

    def _report(self, inv: EfaInventory) -> None:
        """One log line per problem when it appears, and one when it clears."""
        self._problems.update([("", p) for p in inv.skipped]
                              + [(dev.id, p) for dev in inv.devices for p in dev.problems])
        if not inv.devices and not self._announced_empty:
            log.info("no EFA device on this node; advertising nothing and watching for devices to appear",
                     extra=kv(checked=CLASS_VERBS, instance_type=inv.instance_type or "unknown",
                              non_efa_rdma=len(inv.ignored)))
        self._announced_empty = not inv.devices

    # -- DevicePluginPolicy ---------------------------------------------------------------------------------------
    def devices(self) -> list[AdvertisedDevice]:
        inventory, health, _ = self._state
        return [AdvertisedDevice(d.id, health.get(d.id, HEALTHY).healthy, d.numa_node) for d in inventory.devices]

    def advertise_blocked(self) -> str | None:
        """Nothing is advertised while the EFA DRA driver is registered on this node (it hands out the same EFAs)."""
        return self.scanner.coexistence.device_plugin_blocked(self.paths)

    def preferred(self, available: Sequence[str], must_include: Sequence[str], size: int) -> list[str]:
        return self.topology.preferred(available, must_include, size)

    def allocate(self, ids: Sequence[str]) -> ContainerEdits:
        """One rw DeviceSpec per device: its ``/dev/infiniband/uverbsN`` as of the latest host scan."""
        inv, health_of, _ = self._state
        nodes: list[DeviceNode] = []
        for device_id in dict.fromkeys(ids):
            dev = inv.get(device_id)
            if dev is None:
                raise AllocationError(f"unknown EFA device ID {device_id!r}")
            health = health_of.get(device_id, HEALTHY)
            if not health.healthy:
                raise AllocationError(f"EFA device {device_id!r} ({dev.ibdev}) is unhealthy: {health.message}")
            nodes.append(DeviceNode(dev.device_node, permissions="rw", major=dev.major, minor=dev.minor))
        self.allocation_counts.update(dict.fromkeys(ids, 1))
        return ContainerEdits(device_nodes=tuple(nodes))
