"""Which Neuron IDs are in use, per resource, so ``neuron`` and ``neuroncore`` never hand out the same chip.

Two sources feed it:

- Allocate: the IDs a container just got (``pending`` until the kubelet's PodResources List shows them);
- PodResources v1 List: every container's ``aws.amazon.com/neuron`` and ``aws.amazon.com/neuroncore`` IDs.

In use = listed by the latest successful List, plus Allocate records the List has not shown yet. A pending record
the List has not confirmed within ``grace`` seconds is dropped (its pod failed admission or is gone). While List
fails, pending records are kept: freeing too late wastes capacity, freeing too early double-counts a chip.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from accel_core.hostfiles import parse_index
from accel_core.logs import kv
from neuron_dra.usage_annotation import NEURON as NEURON
from neuron_dra.usage_annotation import NEURONCORE as NEURONCORE
from neuron_dra.usage_annotation import RESOURCES as RESOURCES

log = logging.getLogger(__name__)



@dataclass(frozen=True)
class _Pending:
    resource: str
    ids: frozenset[str]
    since: float


class UsageTracker:
    """In-use IDs per resource from Allocate and PodResources; all methods are cheap and synchronous."""

    def __init__(self, *, grace: float = 30.0, clock: Callable[[], float] = time.monotonic) -> None:
        self._grace = grace
        self._clock = clock
        self._listed: dict[str, frozenset[str]] = {r: frozenset() for r in RESOURCES}
        self._pending: list[_Pending] = []
        #: ``namespace/name`` -> resource -> IDs, as the latest successful List attributes them
        self.pods: dict[str, dict[str, frozenset[str]]] = {}
        self._in_use: dict[str, frozenset[str]] = {}  # cache of in_use(), cleared on every change
        self.list_ok: bool | None = None
        self.version = 0

    def record_allocate(self, resource: str, ids: Iterable[str]) -> None:
        """Remember an Allocate; the same IDs allocated again replace the older record (same in-use set, the
        newer record's grace)."""
        record = _Pending(resource, frozenset(ids), self._clock())
        self._pending = [p for p in self._pending if (p.resource, p.ids) != (record.resource, record.ids)]
        self._pending.append(record)
        self._in_use.clear()
        self.version += 1

    def apply_list(self, listed: Mapping[str, Iterable[str]],
                   pods: Mapping[str, Mapping[str, Iterable[str]]] | None = None) -> bool:
        """Take a successful List result (and its per-pod view); returns True when the in-use sets or the pods
        holding them changed."""
        before = (self.snapshot(), self.pods)
        if pods is not None:
            self.pods = {p: {r: frozenset(ids) for r, ids in res.items()} for p, res in pods.items()}
        self._listed = {r: frozenset(listed.get(r, ())) for r in RESOURCES}
        now = self._clock()
        kept: list[_Pending] = []
        for rec in self._pending:
            if rec.ids <= self._listed[rec.resource]:
                continue  # the kubelet reports it now
            if now - rec.since > self._grace:
                log.info("allocation never appeared in PodResources; releasing it",
                         extra=kv(resource=rec.resource, ids=",".join(sorted(rec.ids, key=_num)),
                                  age_s=round(now - rec.since, 1)))
                continue
            kept.append(rec)
        self._pending = kept
        self._in_use.clear()
        self.list_ok = True
        changed = (self.snapshot(), self.pods) != before
        if changed:
            self.version += 1
        return changed

    def list_failed(self) -> None:
        self.list_ok = False

    def in_use(self, resource: str) -> frozenset[str]:
        cached = self._in_use.get(resource)
        if cached is None:
            ids = set(self._listed.get(resource, frozenset()))
            for rec in self._pending:
                if rec.resource == resource:
                    ids |= rec.ids
            cached = self._in_use[resource] = frozenset(ids)
        return cached

    def snapshot(self) -> dict[str, frozenset[str]]:
        return {r: self.in_use(r) for r in RESOURCES}

    def pending_count(self) -> int:
        return len(self._pending)


def _num(value: str) -> tuple[int, str]:
    number = parse_index(value)
    return (number, "") if number is not None else (1 << 30, value)
