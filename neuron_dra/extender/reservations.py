"""Reservations: pods the extender passed to nodes and that are not bound yet, bounded in count and in memory, with
a share per namespace so that one tenant cannot push out another's.

A reservation lives ``reserve_for`` seconds, or until the pod watch sees the pod bound. The book holds at most
``max_pods`` reservations and ``max_node_entries`` (pod, node) pairs; one namespace at most ``max_per_namespace``
reservations and the same share of the pairs (``max_node_entries * max_per_namespace / max_pods``). A namespace at
its share makes room by dropping its own oldest reservations (counted in :attr:`ReservationBook.evicted`); when the
whole book is full the new reservation is refused (:attr:`ReservationBook.refused`): a live reservation of another
namespace is never dropped for a newcomer. Node names are interned, so a thousand reservations over the same nodes
hold one copy of each name. Every operation is O(1) apart from the reservation's own node names.
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
MAX_PER_NAMESPACE = 256


@dataclass(frozen=True)
class Reservation:
    """A pod the extender passed to ``nodes`` that is not bound yet."""

    pod: PodInfo
    nodes: frozenset[str]
    until: float


class _Namespace:
    """One namespace's reservations in expiry order and its (pod, node) pairs."""

    __slots__ = ("by_uid", "node_entries")

    def __init__(self) -> None:
        self.by_uid: OrderedDict[str, Reservation] = OrderedDict()
        self.node_entries = 0


def namespace_of(pod: PodInfo) -> str:
    return pod.key.partition("/")[0]


class ReservationBook:
    """Reservations by pod UID in expiry order (every reservation lives the same time, so oldest = first)."""

    def __init__(self, reserve_for: float = 15.0, *, max_pods: int = MAX_PODS,
                 max_node_entries: int = MAX_NODE_ENTRIES, max_per_namespace: int | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        if max_pods < 1 or max_node_entries < 1 or (max_per_namespace is not None and max_per_namespace < 1):
            raise ValueError("reservation caps must be at least 1")
        self.reserve_for = reserve_for
        self.max_pods = max_pods
        self.max_node_entries = max_node_entries
        self.max_per_namespace = min(max_per_namespace or max_pods, max_pods)
        self.max_namespace_entries = max(1, max_node_entries * self.max_per_namespace // max_pods)
        self._clock = clock
        self._by_uid: OrderedDict[str, Reservation] = OrderedDict()
        self._namespaces: dict[str, _Namespace] = {}
        self.node_entries = 0
        #: reservations a namespace dropped of its own to stay within its share, since start
        self.evicted = 0
        #: new reservations refused because the book was full, since start
        self.refused = 0

    def __len__(self) -> int:
        return len(self._by_uid)

    def __contains__(self, uid: object) -> bool:
        return uid in self._by_uid

    def add(self, pod: PodInfo, nodes: Iterable[str]) -> int:
        """Reserve ``pod`` on ``nodes`` (replacing its previous reservation); returns how many of its namespace's
        reservations made room. A refusal (book full) increments :attr:`refused`."""
        names = frozenset(sys.intern(n) for n in nodes)
        self.drop(pod.uid)
        self._expire()
        if not pod.uid or not names:
            return 0
        if len(names) > self.max_namespace_entries:  # more nodes than a namespace's share of pairs
            self.refused += 1
            return 0
        ns = self._namespaces.get(namespace_of(pod)) or _Namespace()
        evicted = 0
        while ns.by_uid and (len(ns.by_uid) >= self.max_per_namespace
                             or ns.node_entries + len(names) > self.max_namespace_entries):
            self.drop(next(iter(ns.by_uid)))
            evicted += 1
        self.evicted += evicted
        if len(self._by_uid) >= self.max_pods or self.node_entries + len(names) > self.max_node_entries:
            self.refused += 1
            return evicted
        reservation = Reservation(pod, names, self._clock() + self.reserve_for)
        self._by_uid[pod.uid] = reservation
        ns.by_uid[pod.uid] = reservation
        self._namespaces[namespace_of(pod)] = ns
        ns.node_entries += len(names)
        self.node_entries += len(names)
        return evicted

    def drop(self, uid: str) -> None:
        gone = self._by_uid.pop(uid, None)
        if gone is None:
            return
        self.node_entries -= len(gone.nodes)
        name = namespace_of(gone.pod)
        ns = self._namespaces.get(name)
        if ns is not None and ns.by_uid.pop(uid, None) is not None:
            ns.node_entries -= len(gone.nodes)
            if not ns.by_uid:
                del self._namespaces[name]

    def live(self) -> list[Reservation]:
        """The unexpired reservations (expired ones are forgotten)."""
        self._expire()
        return list(self._by_uid.values())

    def namespaces(self) -> int:
        return len(self._namespaces)

    def _expire(self) -> None:
        now = self._clock()
        while self._by_uid:
            uid, first = next(iter(self._by_uid.items()))
            if first.until >= now:
                return
            self.drop(uid)
