"""The one health rule for Neuron devices, used by the Neuron device plugin and the Neuron DRA driver alike.

A device is unhealthy when discovery says it is gone from the driver (``DeviceMissing``), its ``/dev/neuronN`` node
is missing (``DevNodeMissing``), or its uncorrected ECC counters (memory or SRAM) are above zero
(``UncorrectedErrors``). The rule reads typed facts only (problem kinds, presence, counters), never message text.

Recovery semantics (docs/neuron-device-plugin.md, "Health"): the rule keeps no state. A vanished device is healthy
again as soon as it is back. The ECC counters count since the Neuron driver loaded and only grow, so a device
with uncorrected errors stays unhealthy until they read zero again, which means a driver reload or a reboot; a
restart of the plugin or the driver does not forgive them, and both daemons always agree.

The counters change without any sysfs event: both daemons poll the files :func:`health_files` names between their
full rescans.
"""

from __future__ import annotations

from pathlib import Path

from accel_core.health import DeviceHealth, ProblemKind, kinds
from accel_core.paths import HostPaths
from neuron_dra.discovery import CLASS_DIR, UNCORRECTED_COUNTERS, NeuronDevice, NeuronInventory

REASON_DEVICE_MISSING = ProblemKind.DEVICE_MISSING.value
REASON_DEV_NODE_MISSING = ProblemKind.DEV_NODE_MISSING.value
REASON_UNCORRECTED_ERRORS = "UncorrectedErrors"


def device_health(dev: NeuronDevice) -> DeviceHealth:
    """The health of one device."""
    found = kinds(dev.problems)
    sysfs = f"{CLASS_DIR}/neuron{dev.index}"
    if ProblemKind.DEVICE_MISSING in found or (not dev.present and ProblemKind.DEV_NODE_MISSING not in found):
        return DeviceHealth(False, REASON_DEVICE_MISSING,
                            f"{sysfs} is gone: the Neuron driver no longer lists device {dev.index}")
    if ProblemKind.DEV_NODE_MISSING in found:
        return DeviceHealth(False, REASON_DEV_NODE_MISSING,
                            f"{dev.dev_node} is missing: containers cannot use device {dev.index}")
    if dev.uncorrected_errors > 0:
        return DeviceHealth(False, REASON_UNCORRECTED_ERRORS,
                            f"device {dev.index} reports {dev.uncorrected_errors} uncorrected ECC errors "
                            "(memory/SRAM) since the Neuron driver loaded; it stays unhealthy until they read 0 "
                            "again (driver reload or reboot)")
    return DeviceHealth(True)


def assess(inv: NeuronInventory) -> dict[int, DeviceHealth]:
    """The health of every device in the inventory, by index (in index order)."""
    return {dev.index: device_health(dev) for dev in inv.devices}


def health_files(paths: HostPaths, inv: NeuronInventory) -> list[Path]:
    """Each present device's uncorrected-error counter files (``<counter>/total`` where the counter is a
    directory), the facts of the rule above that change without a sysfs event."""
    out = []
    for dev in inv.devices:
        if not dev.present:
            continue
        for name in UNCORRECTED_COUNTERS:
            counter = paths.host(f"{CLASS_DIR}/neuron{dev.index}/stats/hardware/{name}")
            out.append(counter / "total" if counter.is_dir() else counter)
    return out
