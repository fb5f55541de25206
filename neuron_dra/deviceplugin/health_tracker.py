"""Device health for the device plugin, as the host scan gives it (the one Neuron rule, :mod:`neuron_dra.health_rule`),
remembered across scans so changes are logged once and ListAndWatch is re-sent only when something changed."""

from __future__ import annotations

import logging
from collections.abc import Mapping

from accel_core.health import DeviceHealth
from accel_core.logs import kv
from neuron_dra.discovery import NeuronInventory

log = logging.getLogger(__name__)


class HealthTracker:
    """Per-device health of the latest inventory; :meth:`update` returns devices whose health changed."""

    def __init__(self) -> None:
        self._state: dict[int, DeviceHealth] = {}

    def update(self, inventory: NeuronInventory, health: Mapping[str, DeviceHealth]) -> list[int]:
        """``health``: the scan's, by index as a string."""
        changed: list[int] = []
        for dev in inventory.devices:
            state = health[str(dev.index)]
            if self._state.get(dev.index) != state:
                if dev.index in self._state or not state.healthy:
                    level = logging.INFO if state.healthy else logging.WARNING
                    log.log(level, "device healthy" if state.healthy else "device unhealthy",
                            extra=kv(device=dev.index, reason=state.reason or "recovered",
                                     message=state.message or None))
                self._state[dev.index] = state
                changed.append(dev.index)
        return changed

    def get(self, index: int) -> DeviceHealth:
        return self._state.get(index, DeviceHealth(False, "Unknown", f"device {index} is unknown"))

    def healthy(self, index: int) -> bool:
        return self.get(index).healthy
