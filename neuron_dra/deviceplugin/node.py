"""State both registrations share: the inventory, device health, IDs in use, the coexistence guard.

ID scheme (what the kubelet, PodResources and CloudWatch Container Insights see):
``aws.amazon.com/neuron`` ID = device index (``"3"``); ``aws.amazon.com/neuroncore`` ID = global logical core
index = device index * logical cores per device + local core (``"13"`` is device 3, core 1 at 4 per device;
:mod:`neuron_dra.coreids`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from accel_core.hostfiles import parse_index
from accel_core.hostscan import HostScan
from accel_core.logs import ProblemLog, kv
from accel_core.paths import HostPaths
from neuron_dra import discovery
from neuron_dra.coreids import core_ids
from neuron_dra.deviceplugin.health_tracker import HealthTracker
from neuron_dra.deviceplugin.inuse import NEURON, NEURONCORE, UsageTracker
from neuron_dra.discovery import NeuronInventory
from neuron_dra.edits import CoreNumbering
from neuron_dra.scanner import CoreDevicesScanner
from neuron_dra.topology import Topology

log = logging.getLogger(__name__)

EMPTY_INVENTORY = NeuronInventory("", (), None, False, None, Topology("none", 0), ())


class NeuronNode:
    """One node's Neuron state; ``rediscover`` re-reads the host, the policies read the rest."""

    def __init__(
        self,
        paths: HostPaths,
        *,
        numbering: CoreNumbering = "container",
        grace: float = 30.0,
        clock: Callable[[], float] = time.monotonic,
        full_rescan_interval: float = 10.0,
    ) -> None:
        self.paths = paths
        self.numbering: CoreNumbering = numbering
        # core-aware: a DRA claim on a core device keeps its chip and core from being advertised
        self.scanner = CoreDevicesScanner(full_rescan_interval=full_rescan_interval, clock=clock)
        self.health = HealthTracker()
        self.usage = UsageTracker(grace=grace, clock=clock)
        self.inventory = EMPTY_INVENTORY
        self.on_change: Callable[[], None] | None = None
        self._problems = ProblemLog(log, "host problem", "host problem resolved")
        self._last_problems: tuple[str, ...] | None = None
        self._first = True
        self._usage_key: tuple[int, int] | None = None  # (usage version, cores per device) of the caches below
        self._by_cores: dict[int, list[int]] = {}
        self._whole: frozenset[int] = frozenset()

    # -- host ----------------------------------------------------------------------------------------------------
    def rediscover(self) -> None:
        """Scan the host here and take the scan (tests, benchmarks; the daemon scans in a worker thread)."""
        self.update(self.scanner.scan(self.paths))

    def update(self, host: HostScan[NeuronInventory]) -> None:
        """Take a scan of the Neuron host scanner (which never raises for bad host files): inventory and health;
        logs new problems and health changes. Between full scans (every ``full_rescan_interval`` s) the scanner
        re-reads only presence and ECC counters, which keeps the frequent health rescans short."""
        inv = host.inventory
        if host.problems != self._last_problems:
            self._problems.update(("", p) for p in host.problems)
            self._last_problems = host.problems
        self.health.update(inv, host.health)
        if self._first or (len(inv.devices), inv.lnc, inv.topology.kind) != (
                len(self.inventory.devices), self.inventory.lnc, self.inventory.topology.kind):
            if inv.devices:
                log.info("neuron devices", extra=kv(instance_type=inv.instance_type or "unknown",
                                                    devices=len(inv.devices), cores=inv.total_logical_cores(),
                                                    lnc=inv.lnc if inv.lnc_applies else "n/a",
                                                    topology=inv.topology.kind, driver=inv.driver_version))
            else:
                log.info("no Neuron devices on this node; advertising nothing and watching for devices",
                         extra=kv(instance_type=inv.instance_type or "unknown",
                                  class_dir=str(self.paths.host(discovery.CLASS_DIR))))
        self._first = False
        self.inventory = inv

    def blocked(self) -> str | None:
        """Why nothing is advertised now (the DRA driver serves this node), or None; the device-plugin service's
        :class:`~accel_core.deviceplugin.handover.DraHandover` logs and reports the changes."""
        return self.scanner.coexistence.device_plugin_blocked(self.paths)

    # -- IDs -----------------------------------------------------------------------------------------------------
    @property
    def cores_per_device(self) -> int:
        return self.inventory.logical_cores_per_device()

    def core_ids(self, device: int) -> range:
        return core_ids(device, self.cores_per_device)

    def device_of_core(self, core: int) -> int:
        return core // self.cores_per_device if self.cores_per_device else -1

    # -- usage across the two resources --------------------------------------------------------------------------
    def devices_used_by_cores(self) -> dict[int, list[int]]:
        """Device -> its cores in use through ``aws.amazon.com/neuroncore`` (shared; do not modify)."""
        self._refresh_usage()
        return self._by_cores

    def devices_used_whole(self) -> frozenset[int]:
        """Devices in use through ``aws.amazon.com/neuron``."""
        self._refresh_usage()
        return self._whole

    def _refresh_usage(self) -> None:
        """Recompute the per-device views of usage only when usage (or the core count) changed."""
        key = (self.usage.version, self.cores_per_device)
        if key == self._usage_key:
            return
        by_cores: dict[int, list[int]] = {}
        for cid in self.usage.in_use(NEURONCORE):
            core = parse_index(cid)
            if core is not None:
                by_cores.setdefault(self.device_of_core(core), []).append(core)
        self._by_cores = {d: sorted(c) for d, c in by_cores.items()}
        self._whole = frozenset(n for i in self.usage.in_use(NEURON) if (n := parse_index(i)) is not None)
        self._usage_key = key

    def conflicts(self) -> set[int]:
        """Devices both resources hold at once (should never happen; reported by metrics and logs)."""
        return set(self.devices_used_whole()) & set(self.devices_used_by_cores())

    def notify(self) -> None:
        """Tell the daemon that usage changed (it re-sends both device lists)."""
        if self.on_change is not None:
            self.on_change()
