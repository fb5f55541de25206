"""Per-device health from the inventory: a device is unhealthy when its sysfs entry or its /dev node is gone, or
when its uncorrected ECC counters (memory or SRAM) are above zero.

The counters only grow until the next reboot, so an uncorrected error keeps the device unhealthy until then,
as the Neuron node problem detector treats these errors as permanent. A vanished device becomes healthy again
when it comes back.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

from accel_core.dra.types import DeviceHealthReport
from neuron_dra.discovery import CLASS_DIR, NeuronInventory

REASON_DEVICE_MISSING = "DeviceMissing"
REASON_DEV_NODE_MISSING = "DevNodeMissing"
REASON_UNCORRECTED_ERRORS = "UncorrectedErrors"


@dataclass(frozen=True)
class DeviceCondition:
    """Health of one device; ``reason`` is a short CamelCase word (also the taint value) when unhealthy."""

    index: int
    healthy: bool
    reason: str = ""
    message: str = ""


def assess(inv: NeuronInventory) -> dict[int, DeviceCondition]:
    """The condition of every device in the inventory, by index."""
    out: dict[int, DeviceCondition] = {}
    for dev in inv.devices:
        sysfs = f"{CLASS_DIR}/neuron{dev.index}"
        sysfs_gone = any(p.startswith(f"{sysfs}: missing") for p in dev.problems)
        node_gone = any(p.startswith(f"{dev.dev_node}: missing") for p in dev.problems)
        if sysfs_gone or (not dev.present and not node_gone):
            out[dev.index] = DeviceCondition(dev.index, False, REASON_DEVICE_MISSING,
                                             f"{sysfs} is gone: the Neuron driver no longer lists device {dev.index}")
        elif node_gone:
            out[dev.index] = DeviceCondition(dev.index, False, REASON_DEV_NODE_MISSING,
                                             f"{dev.dev_node} is missing: containers cannot use device {dev.index}")
        elif dev.uncorrected_errors > 0:
            out[dev.index] = DeviceCondition(dev.index, False, REASON_UNCORRECTED_ERRORS,
                                             f"device {dev.index} reports {dev.uncorrected_errors} uncorrected ECC "
                                             "errors (memory/SRAM); it stays unhealthy until the node reboots")
        else:
            out[dev.index] = DeviceCondition(dev.index, True)
    return out


def health_reports(pool: str, conditions: Mapping[int, DeviceCondition], name: Callable[[int], str],
                   timeout_seconds: int = 0) -> list[DeviceHealthReport]:
    """The complete list for the kubelet's health stream, in device order."""
    return [DeviceHealthReport(pool, name(i), c.healthy, c.message, timeout_seconds)
            for i, c in sorted(conditions.items())]
