"""Device health from the inventory: present (sysfs entry and /dev node) and no new uncorrected ECC errors.

An uncorrected ECC counter is compared with a baseline: the value when the device was first seen, so errors
from before the plugin started do not condemn a device forever. A rise makes the device Unhealthy; when the
counter is cleared (back at or below the baseline, e.g. after a driver reset) the device recovers and the
baseline follows the counter down.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from accel_core.logs import kv
from neuron_dra.discovery import NeuronInventory

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class DeviceHealth:
    healthy: bool
    reason: str = ""


class HealthTracker:
    """Keeps per-device ECC baselines across rediscoveries; :meth:`update` returns devices whose health changed."""

    def __init__(self) -> None:
        self._baseline: dict[int, int] = {}
        self._state: dict[int, DeviceHealth] = {}

    def update(self, inventory: NeuronInventory) -> list[int]:
        changed: list[int] = []
        for dev in inventory.devices:
            if not dev.present:
                missing = [p for p in dev.problems if p.endswith("missing") or "missing (" in p]
                state = DeviceHealth(False, "; ".join(missing) or f"{dev.dev_node} is not present")
            else:
                base = self._baseline.setdefault(dev.index, dev.uncorrected_errors)
                if dev.uncorrected_errors <= base:
                    self._baseline[dev.index] = dev.uncorrected_errors
                    state = DeviceHealth(True)
                else:
                    state = DeviceHealth(False, f"uncorrected ECC errors rose from {base} to {dev.uncorrected_errors}")
            if self._state.get(dev.index) != state:
                if dev.index in self._state or not state.healthy:
                    level = logging.INFO if state.healthy else logging.WARNING
                    log.log(level, "device healthy" if state.healthy else "device unhealthy",
                            extra=kv(device=dev.index, reason=state.reason or "recovered"))
                self._state[dev.index] = state
                changed.append(dev.index)
        return changed

    def get(self, index: int) -> DeviceHealth:
        return self._state.get(index, DeviceHealth(False, f"device {index} is unknown"))

    def healthy(self, index: int) -> bool:
        return self.get(index).healthy
