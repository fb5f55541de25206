"""Neuron interconnect facts written out from ../shared/reference/neuron.md section 3, and connectivity by definition.

These are the test oracles for the topology and allocation code: nothing here is computed by the code under test.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from itertools import combinations

# trn2.48xlarge `connected_devices` of device 0..15, in the driver's order (DRV v3 trn2_32xl_neigbor_ids).
TRN2_LINKS: list[tuple[int, ...]] = [
    (12, 1, 3, 4), (0, 13, 5, 2), (14, 3, 1, 6), (2, 15, 7, 0), (8, 5, 7, 0), (4, 9, 1, 6), (10, 7, 5, 2),
    (6, 11, 3, 4), (4, 9, 11, 12), (8, 5, 13, 10), (6, 11, 9, 14), (10, 7, 15, 8), (0, 13, 15, 8), (12, 1, 9, 14),
    (2, 15, 13, 10), (14, 3, 11, 12)]

# trn1.32xlarge, driver order (up, left, down, right): the same neighbour sets in another order.
TRN1_LINKS: list[tuple[int, ...]] = [
    (12, 3, 4, 1), (13, 0, 5, 2), (14, 1, 6, 3), (15, 2, 7, 0), (0, 7, 8, 5), (1, 4, 9, 6), (2, 5, 10, 7),
    (3, 6, 11, 4), (4, 11, 12, 9), (5, 8, 13, 10), (6, 9, 14, 11), (7, 10, 15, 8), (8, 15, 0, 13), (9, 12, 1, 14),
    (10, 13, 2, 15), (11, 14, 3, 12)]

# inf2.48xlarge: a ring 0..11 with wrap; inf2.24xlarge: a chain 0-1-2-3-4-5 (the ends have one neighbour).
INF2_48_LINKS: list[tuple[int, ...]] = [
    (11, 1), (0, 2), (1, 3), (2, 4), (3, 5), (4, 6), (5, 7), (6, 8), (7, 9), (8, 10), (9, 11), (10, 0)]
INF2_24_LINKS: list[tuple[int, ...]] = [(1,), (0, 2), (1, 3), (2, 4), (3, 5), (4,)]

# Connected groups on the 4x4 torus nodes (trn1/trn1n/trn2): 1, one row of 4, two rows of 8, all 16.
TORUS_GROUPS: dict[int, list[frozenset[int]]] = {
    1: [frozenset({i}) for i in range(16)],
    4: [frozenset({0, 1, 2, 3}), frozenset({4, 5, 6, 7}), frozenset({8, 9, 10, 11}), frozenset({12, 13, 14, 15})],
    8: [frozenset({0, 1, 2, 3, 4, 5, 6, 7}), frozenset({8, 9, 10, 11, 12, 13, 14, 15})],
    16: [frozenset(range(16))],
}


def connected(devices: Iterable[int], links: Sequence[Iterable[int]]) -> bool:
    """A set is connected when its induced subgraph is: every member is reached from any other through members."""
    wanted = set(devices)
    if not wanted:
        return False
    start = min(wanted)
    seen, todo = {start}, [start]
    while todo:
        for nxt in links[todo.pop()]:
            if nxt in wanted and nxt not in seen:
                seen.add(nxt)
                todo.append(nxt)
    return seen == wanted


def smallest_torus_groups(size: int) -> list[frozenset[int]]:
    """The documented groups a set of ``size`` devices must fit in: those of the smallest group size >= size."""
    return TORUS_GROUPS[min(g for g in TORUS_GROUPS if g >= size)]


def well_placed_on_torus(devices: Iterable[int]) -> bool:
    """Connected, and inside one documented group of the smallest group size that can hold it."""
    chosen = frozenset(devices)
    return connected(chosen, TRN2_LINKS) and any(chosen <= g for g in smallest_torus_groups(len(chosen)))


def well_placed_sets_within(free: Iterable[int], size: int) -> list[frozenset[int]]:
    """Every well-placed set of ``size`` devices that uses only ``free`` devices."""
    free_set = frozenset(free)
    found = []
    for group in smallest_torus_groups(size):
        for combo in combinations(sorted(group & free_set), size):
            if connected(combo, TRN2_LINKS):
                found.append(frozenset(combo))
    return found
