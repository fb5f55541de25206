"""The Neuron host scanner (:class:`accel_core.hostscan.HostScanner`), shared by the Neuron device plugin and the
Neuron DRA driver: discovery with the one Neuron health rule, the devices seen earlier, what to watch and poll, and
the coexistence guard between ``neuron-devplugin.sock``/``neuroncore-devplugin.sock`` and ``neuron.aws.com``.
:class:`CoreDevicesScanner` maps the driver's core devices too (``neuron-device-<i>-core-<k>``, published with
``--core-devices``): the device plugin always uses it, since a claim on a core device may run on its node whatever
the driver's setting was.

A device seen earlier that vanishes stays in the inventory (``present=False``, unhealthy) with the PCI address,
PCIe root and NUMA node it had, so what both daemons show of it stays put while it is gone.

With ``full_rescan_interval`` > 0 (the device plugin's frequent health rescans), scans in between re-read only
presence and the uncorrected-error counters (:func:`neuron_dra.discovery.refresh_state`); any change in presence
forces a full scan at once.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

from accel_core.coexistence import Coexistence
from accel_core.hostscan import HostScan, SeenDevices
from accel_core.paths import HostPaths
from neuron_dra import COEXISTENCE, DEVICE_PREFIX, NEURON_RESOURCE, NEURONCORE_RESOURCE, coreids, health_rule
from neuron_dra.coreids import core_id, core_ids
from neuron_dra.discovery import CLASS_DIR, LNC_FILE, NeuronDevice, NeuronInventory, discover, refresh_state

#: Core device names: ``neuron-device-<chip>-core-<logical core>`` (:mod:`neuron_dra.dra.cores`).
CORE_INFIX = "-core-"


def core_device_name(chip: int, core: int) -> str:
    return f"{DEVICE_PREFIX}{chip}{CORE_INFIX}{core}"


def logical_cores(dev: NeuronDevice, lnc: int | None) -> int:
    """The chip's logical cores as core devices: none for a chip whose core count is unknown (0)."""
    return coreids.logical_cores(dev.core_count, lnc) if dev.core_count > 0 else 0


def _restore(dev: NeuronDevice, last: NeuronDevice) -> NeuronDevice:
    """A listed but absent device keeps the slot it had when it was present."""
    return replace(dev, pci_address=dev.pci_address or last.pci_address, pcie_root=dev.pcie_root or last.pcie_root,
                   numa_node=dev.numa_node if dev.numa_node is not None else last.numa_node)


def _gone(dev: NeuronDevice) -> NeuronDevice:
    """Discovery lists every known index, so this only covers a device it did not list at all."""
    return replace(dev, present=False)


class NeuronScanner:
    """Reads the Neuron devices of a host and remembers every one seen."""

    udev_subsystems: tuple[str, ...] = ("neuron_device",)
    coexistence: Coexistence = COEXISTENCE

    def __init__(self, *, full_rescan_interval: float = 0.0, clock: Callable[[], float] = time.monotonic) -> None:
        self._seen: SeenDevices[int, NeuronDevice] = SeenDevices(lambda d: d.index, present=lambda d: d.present,
                                                                 vanished=_gone, restore=_restore)
        self._full_every = full_rescan_interval
        self._clock = clock
        self._last_full = float("-inf")
        self._last: NeuronInventory | None = None

    def scan(self, paths: HostPaths) -> HostScan[NeuronInventory]:
        now = self._clock()
        if self._last is not None and now - self._last_full < self._full_every:
            quick = refresh_state(paths, self._last)
            if quick is not None:
                return self._result(quick, ())
        self._last_full = now
        found = discover(paths, known=self._seen.keys())
        devices, new = self._seen.update(found.devices)
        return self._result(replace(found, devices=tuple(devices)), tuple(str(d.index) for d in new))

    def _result(self, inv: NeuronInventory, new: tuple[str, ...]) -> HostScan[NeuronInventory]:
        self._last = inv
        health = {str(i): state for i, state in health_rule.assess(inv).items()}
        summary = {"instance_type": inv.instance_type or None, "topology": inv.topology.kind, "lnc": inv.lnc,
                   "driver_version": inv.driver_version}
        return HostScan(inv, health, tuple(inv.all_problems()), new, summary)

    def watch_paths(self, paths: HostPaths, inventory: NeuronInventory) -> list[Path]:
        """The class directory, the LNC setting, each device's /dev node and counters directory (as files, so the
        watcher watches their directories); each daemon adds its side of the guard. The counters raise no event on
        real sysfs: they are the health files, polled."""
        out = [paths.host(CLASS_DIR), paths.host(LNC_FILE)]
        for dev in inventory.devices:
            out.append(paths.host(dev.dev_node))
            out.append(paths.host(f"{CLASS_DIR}/neuron{dev.index}/stats/hardware"))
        return out

    def device_plugin_ids(self, inventory: NeuronInventory) -> dict[str, tuple[tuple[str, str], ...]]:
        """Each chip's DRA device name with its ``aws.amazon.com/neuron`` ID (the device index) and its
        ``aws.amazon.com/neuroncore`` IDs (global logical core indices: index * logical cores per device + local)."""
        per = inventory.logical_cores_per_device()
        return {f"{DEVICE_PREFIX}{d.index}": ((NEURON_RESOURCE, str(d.index)),
                                              *((NEURONCORE_RESOURCE, str(c)) for c in core_ids(d.index, per)))
                for d in inventory.devices}

    def health_files(self, paths: HostPaths, inventory: NeuronInventory) -> list[Path]:
        """Each present device's uncorrected-error counter files."""
        return health_rule.health_files(paths, inventory)


class CoreDevicesScanner(NeuronScanner):
    """The Neuron host scanner, with each core device's device-plugin IDs beside its chip's."""

    def device_plugin_ids(self, inventory: NeuronInventory) -> dict[str, tuple[tuple[str, str], ...]]:
        ids = super().device_plugin_ids(inventory)
        per = inventory.logical_cores_per_device()
        for dev in inventory.devices:
            for k in range(logical_cores(dev, inventory.lnc)):
                ids[core_device_name(dev.index, k)] = ((NEURON_RESOURCE, str(dev.index)),
                                                       (NEURONCORE_RESOURCE, str(core_id(dev.index, per, k))))
        return ids
