"""The unhealthy-device taint with hysteresis: ``<driver>/unhealthy=<reason>`` as the driver publishes it.

- NoSchedule goes on at once: an unhealthy device gets no new claim.
- With the NoExecute effect (which evicts the pods using the device), the device must stay unhealthy for
  ``noexecute_after`` seconds first; until then it carries NoSchedule. A port that goes DOWN for a moment, or
  flaps, evicts nothing. A device seen healthy once starts its clock again.
- ``timeAdded`` is the driver's, not the API server's write time: when the device was first seen unhealthy
  (NoSchedule), or that plus ``noexecute_after`` (NoExecute), in whole seconds as the API server stores it. So
  a slice rewritten for another device, or by a restarted driver, keeps every pod's ``tolerationSeconds`` clock.
- After a restart, :meth:`UnhealthyTaints.seed` takes the unhealthy-since times back from the taints the API
  server still holds (read by the publisher's own first listing: no extra request), for the devices that are
  still unhealthy; a device found healthy drops its old time.

The clock is injectable (wall-clock seconds) for tests.
"""

from __future__ import annotations

import asyncio
import dataclasses
import math
import time
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime

from accel_core.dra.profile import unhealthy_taint_key
from accel_core.dra.slicemodel import SliceDevice, Taint
from accel_core.health import DeviceHealth
from accel_core.watch import STOP, wake

#: Seconds a device must stay unhealthy before its NoExecute taint is published: well above a health poll (0.75 s),
#: a port flap and a driver restart's first scans.
DEFAULT_NOEXECUTE_AFTER = 30.0


def _stamp(seconds: float) -> datetime:
    return datetime.fromtimestamp(math.floor(seconds), UTC)


class UnhealthyTaints:
    """Per-device unhealthy-since times, and the taints they give (see the module docstring)."""

    def __init__(self, driver: str, effect: str = "NoSchedule", *, noexecute_after: float = DEFAULT_NOEXECUTE_AFTER,
                 clock: Callable[[], float] = time.time) -> None:
        self.key = unhealthy_taint_key(driver)
        self.effect = effect
        self.noexecute_after = noexecute_after
        self.clock = clock
        self._since: dict[str, float] = {}
        self._seeded = False
        self._changed = asyncio.Event()

    def apply(self, devices: Sequence[SliceDevice], health: Mapping[str, DeviceHealth]) -> list[SliceDevice]:
        """``devices`` with the unhealthy taint on every unhealthy one, as of now; forgets the devices that are
        healthy or gone."""
        now = self.clock()
        unhealthy = {d.name for d in devices if (s := health.get(d.name)) is not None and not s.healthy}
        for name in [n for n in self._since if n not in unhealthy]:
            del self._since[name]
        for name in unhealthy:
            self._since.setdefault(name, now)
        self._changed.set()
        return [dataclasses.replace(d, taints=(self.taint(d.name, health[d.name].reason, now),))
                if d.name in unhealthy else d for d in devices]

    def taint(self, device: str, reason: str, now: float) -> Taint:
        since = self._since[device]
        if self.effect == "NoExecute":
            if now >= since + self.noexecute_after:
                return Taint(self.key, reason, "NoExecute", _stamp(since + self.noexecute_after))
            return Taint(self.key, reason, "NoSchedule", _stamp(since))
        return Taint(self.key, reason, self.effect, _stamp(since))

    def next_change(self) -> float | None:
        """Clock time at which a held device's taint turns NoExecute (None: nothing pending)."""
        if self.effect != "NoExecute":
            return None
        now = self.clock()
        due = [s + self.noexecute_after for s in self._since.values() if s + self.noexecute_after > now]
        return min(due, default=None)

    def seed(self, published: Mapping[str, Sequence[Taint]]) -> bool:
        """Once, after a (re)start: take the unhealthy-since times from the taints the API server holds, for the
        devices unhealthy now (earlier times only). Returns True when a time changed (re-apply then)."""
        if self._seeded:
            return False
        self._seeded = True
        changed = False
        for name, taints in published.items():
            if name not in self._since:
                continue  # healthy now (or not published): the old taint does not persist
            for t in taints:
                if t.key != self.key or t.time_added is None:
                    continue
                since = t.time_added.timestamp()
                if t.effect == "NoExecute":
                    since -= self.noexecute_after
                if since < self._since[name]:
                    self._since[name] = since
                    changed = True
        return changed

    async def run(self, stop: asyncio.Event, on_due: Callable[[], None]) -> None:
        """Call ``on_due`` whenever a held device's NoExecute time comes (no host event marks it)."""
        while True:
            self._changed.clear()
            due = self.next_change()
            timeout = None if due is None else max(0.0, due - self.clock())
            woke = await wake(stop, self._changed, timeout=timeout)
            if woke == STOP:
                return
            if due is not None and self.clock() >= due:
                on_due()
