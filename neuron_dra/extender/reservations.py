"""Reservations: pods the extender passed to nodes and that are not bound yet, bounded in count and in memory.

A reservation lives ``reserve_for`` seconds, or until the pod watch sees the pod bound. At most ``max_pods``
reservations and ``max_node_entries`` (pod, node) pairs are kept; past either cap the oldest go first, and every
eviction is counted (the service turns the count into a metric and a warning). Node names are interned, so a
thousand reservations over the same nodes hold one copy of each name.
"""

from __future__ import annotations

import sys
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from neuron_dra.extender.podspec import PodInfo

MAX_PODS = 1024
MAX_NODE_ENTRIES = 131072


@dataclass(frozen=True)
class Reservation:
    """A pod the extender passed to ``nodes`` that is not bound yet."""

    pod: PodInfo
    nodes: frozenset[str]
    until: float


class ReservationBook:
    """Reservations by pod UID in expiry order (every reservation lives the same time, so oldest = first)."""

    def __init__(self, reserve_for: float = 15.0, *, max_pods: int = MAX_PODS,
                 max_node_entries: int = MAX_NODE_ENTRIES, clock: Callable[[], float] = time.monotonic) -> None:
        if max_pods < 1 or max_node_entries < 1:
            raise ValueError("reservation caps must be at least 1")
        self.reserve_for = reserve_for
        self.max_pods = max_pods
        self.max_node_entries = max_node_entries
        self._clock = clock
        self._by_uid: OrderedDict[str, Reservation] = OrderedDict()
        self.node_entries = 0
        #: reservations dropped for a cap (not for expiry or binding) since start
        self.evicted = 0

    def __len__(self) -> int:
        return len(self._by_uid)

    def __contains__(self, uid: object) -> bool:
        return uid in self._by_uid

    def add(self, pod: PodInfo, nodes: Iterable[str]) -> int:
        """Reserve ``pod`` on ``nodes`` (replacing its previous reservation); returns how many were evicted."""
        names = frozenset(sys.intern(n) for n in nodes)
        self.drop(pod.uid)
        self._expire()
        if not pod.uid or not names:
            return 0
        self._by_uid[pod.uid] = Reservation(pod, names, self._clock() + self.reserve_for)
        self.node_entries += len(names)
        evicted = 0
        while len(self._by_uid) > self.max_pods or self.node_entries > self.max_node_entries:
            _, oldest = self._by_uid.popitem(last=False)
            self.node_entries -= len(oldest.nodes)
            evicted += 1
        self.evicted += evicted
        return evicted

    def drop(self, uid: str) -> None:
        gone = self._by_uid.pop(uid, None)
        if gone is not None:
            self.node_entries -= len(gone.nodes)

    def live(self) -> list[Reservation]:
        """The unexpired reservations (expired ones are forgotten)."""
        self._expire()
        return list(self._by_uid.values())

    def _expire(self) -> None:
        now = self._clock()
        while self._by_uid:
            uid, first = next(iter(self._by_uid.items()))
            if first.until >= now:
                return
            self.drop(uid)
