"""Neuron device interconnect topology: 4x4 torus (trn1/trn1n/trn2), ring (inf1, inf2.48xlarge), chain
(inf2.24xlarge), single device, or none.

The kind is derived from the driver's ``connected_devices`` lists and cross-checked with the instance catalog by
:func:`build_topology`. Connected groups follow the Neuron scheduler extension and the DRA ``devicegroupN_id``
attributes: on the torus device ``i`` sits at row ``i // 4``, column ``i % 4``, and the connected groups are
aligned blocks of 1, 4 (one row), 8 (two rows) or 16 devices. On a ring or chain any run of neighbours is
connected (a ring run may wrap from the last device to device 0).

Sets of devices are also handled as bit masks (bit ``i`` = device ``i``) because the allocator filters many
candidate sets per request.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from itertools import combinations
from typing import Literal

TopologyKind = Literal["torus4x4", "ring", "chain", "single", "none"]
KINDS: tuple[TopologyKind, ...] = ("torus4x4", "ring", "chain", "single", "none")

TORUS_SIDE = 4
TORUS_DEVICES = TORUS_SIDE * TORUS_SIDE
TORUS_GROUP_SIZES = (1, 4, 8, 16)


class TopologyError(ValueError):
    """A topology question that has no answer (coordinates on a ring, a group size the torus does not have)."""


def regular_neighbours(kind: str, count: int) -> tuple[tuple[int, ...], ...]:
    """Sorted neighbour ids of every device of a regular topology; empty lists for ``single`` and ``none``."""
    out: list[tuple[int, ...]] = []
    for i in range(count):
        near: set[int] = set()
        if kind == "torus4x4" and count == TORUS_DEVICES:
            row, col = divmod(i, TORUS_SIDE)
            near = {((row - 1) % 4) * 4 + col, ((row + 1) % 4) * 4 + col,
                    row * 4 + (col - 1) % 4, row * 4 + (col + 1) % 4}
        elif kind == "ring" and count > 2:
            near = {(i - 1) % count, (i + 1) % count}
        elif kind in ("chain", "ring"):
            near = {j for j in (i - 1, i + 1) if 0 <= j < count}
        out.append(tuple(sorted(near)))
    return tuple(out)


def classify(neighbours: Sequence[Iterable[int]]) -> TopologyKind | None:
    """The kind whose neighbour lists equal ``neighbours`` (as sets); None if they match no regular shape."""
    count = len(neighbours)
    if count == 0:
        return "none"
    if count == 1:
        return "single"
    sets = [frozenset(n) for n in neighbours]
    if all(not s for s in sets):
        return "none"
    regular: tuple[TopologyKind, ...] = ("torus4x4", "ring", "chain")
    for kind in regular:
        if (kind == "torus4x4" and count != TORUS_DEVICES) or (kind == "ring" and count < 3):
            continue
        if sets == [frozenset(n) for n in regular_neighbours(kind, count)]:
            return kind
    return None


def torus_coordinates(index: int) -> tuple[int, int]:
    """(x, y) = (row, column) of a device on the 4x4 torus."""
    if not 0 <= index < TORUS_DEVICES:
        raise TopologyError(f"device {index} is not on a 4x4 torus (0..15)")
    return divmod(index, TORUS_SIDE)


def aligned_group_id(index: int, size: int) -> int:
    """The aligned block of ``size`` devices that ``index`` belongs to (``index // size``)."""
    if size <= 0:
        raise TopologyError(f"group size must be positive, got {size}")
    return index // size


def mask_of(indices: Iterable[int]) -> int:
    out = 0
    for i in indices:
        out |= 1 << i
    return out


def members(mask: int) -> tuple[int, ...]:
    """Device indices of a bit mask, ascending."""
    out = []
    i = 0
    while mask:
        if mask & 1:
            out.append(i)
        mask >>= 1
        i += 1
    return tuple(out)


@dataclass(frozen=True)
class Topology:
    """How the devices of one node are linked. ``neighbours[i]`` lists device ``i``'s neighbours (sorted)."""

    kind: TopologyKind
    device_count: int
    neighbours: tuple[tuple[int, ...], ...] = ()
    source: str = "connected_devices"
    _masks: dict[int, tuple[int, ...]] = field(default_factory=dict, init=False, repr=False, compare=False,
                                               hash=False)

    @classmethod
    def regular(cls, kind: TopologyKind, count: int, source: str = "catalog") -> Topology:
        return cls(kind, count, regular_neighbours(kind, count), source)

    # -- shape questions --------------------------------------------------------------------------------------
    @property
    def group_sizes(self) -> tuple[int, ...]:
        """Sizes with aligned connected groups: 1/4/8/16 on the torus; 1 and divisors of the count on a ring or
        chain (aligned blocks of neighbours); 1 elsewhere."""
        if self.kind == "torus4x4":
            return TORUS_GROUP_SIZES
        if self.kind in ("ring", "chain"):
            return tuple(s for s in range(1, self.device_count + 1) if self.device_count % s == 0)
        return (1,) if self.device_count else ()

    def coordinates(self, index: int) -> tuple[int, int]:
        """(x, y) = (row, column) on the torus; TopologyError for other kinds."""
        if self.kind != "torus4x4":
            raise TopologyError(f"coordinates exist only on a 4x4 torus; this node's topology is {self.kind}")
        return torus_coordinates(index)

    def group_id(self, index: int, size: int) -> int:
        """Id of the aligned connected group of ``size`` holding ``index`` (equal ids = same group)."""
        self._check_index(index)
        if size not in self.group_sizes:
            raise TopologyError(f"a {self.kind} topology of {self.device_count} devices has no connected groups of "
                                f"{size}; sizes: {list(self.group_sizes)}")
        return aligned_group_id(index, size)

    def connected_groups(self, size: int) -> list[tuple[int, ...]]:
        """The aligned connected groups of ``size`` (a partition of the devices)."""
        if size not in self.group_sizes:
            return []
        return [tuple(range(start, start + size)) for start in range(0, self.device_count, size)]

    def runs(self, size: int) -> list[tuple[int, ...]]:
        """Every run of ``size`` neighbours on a ring (wrapping) or chain, in start order."""
        n = self.device_count
        if self.kind not in ("ring", "chain") or not 1 <= size <= n:
            return []
        if self.kind == "chain" or size == n:
            return [tuple(range(s, s + size)) for s in range(0, n - size + 1)]
        return [tuple((s + k) % n for k in range(size)) for s in range(n)]

    def linked(self, a: int, b: int) -> bool:
        return 0 <= a < len(self.neighbours) and b in self.neighbours[a]

    def is_connected(self, indices: Iterable[int]) -> bool:
        """True when the devices form one connected piece using only links among themselves."""
        wanted = set(indices)
        if len(wanted) <= 1:
            return True
        start = next(iter(wanted))
        seen = {start}
        todo = [start]
        while todo:
            cur = todo.pop()
            for nxt in self.neighbours[cur] if 0 <= cur < len(self.neighbours) else ():
                if nxt in wanted and nxt not in seen:
                    seen.add(nxt)
                    todo.append(nxt)
        return seen == wanted

    def is_preferred_set(self, indices: Iterable[int]) -> bool:
        """True when ``indices`` has the shape the allocator aims for (see :meth:`candidate_masks`)."""
        mask = mask_of(indices)
        return mask in set(self.candidate_masks(bin(mask).count("1")))

    def candidate_masks(self, size: int) -> tuple[int, ...]:
        """Bit masks of the connected sets of ``size`` devices, best shapes first.

        Torus: sizes 1/4/8/16 are the aligned groups; other sizes are connected subsets of one aligned block of the
        next group size (2 and 3 within a row, 5..7 within two rows, 9..15 anywhere). Ring/chain: runs of
        neighbours. Single/none: single devices only (no links to use).
        """
        cached = self._masks.get(size)
        if cached is None:
            cached = self._compute_masks(size)
            self._masks[size] = cached
        return cached

    def block_size(self, size: int) -> int:
        """The aligned block a torus set of ``size`` lives in (the next group size); the count elsewhere."""
        if self.kind == "torus4x4":
            return next((g for g in TORUS_GROUP_SIZES if g >= size), TORUS_DEVICES)
        return self.device_count

    def _compute_masks(self, size: int) -> tuple[int, ...]:
        n = self.device_count
        if not 1 <= size <= n:
            return ()
        if size == 1:
            return tuple(1 << i for i in range(n))
        if self.kind in ("ring", "chain"):
            return tuple(mask_of(r) for r in self.runs(size))
        if self.kind != "torus4x4":
            return ()
        block = self.block_size(size)
        if block == size:
            return tuple(mask_of(g) for g in self.connected_groups(size))
        out: list[int] = []
        for start in range(0, n, block):
            for combo in combinations(range(start, start + block), size):
                if self.is_connected(combo):
                    out.append(mask_of(combo))
        return tuple(out)

    def _check_index(self, index: int) -> None:
        if not 0 <= index < self.device_count:
            raise TopologyError(f"device {index} does not exist (devices 0..{self.device_count - 1})")


def build_topology(
    connected: Sequence[tuple[int, ...]],
    *,
    expected_kind: str | None = None,
    expected_connected: Sequence[tuple[int, ...]] = (),
    where: str = "connected_devices",
) -> tuple[Topology, list[str]]:
    """Derive the topology from per-device neighbour lists (index ``i`` = device ``i``) and cross-check it.

    ``expected_kind``/``expected_connected`` come from the instance catalog. When the lists form no regular
    shape, or a different one than the catalog says, the catalog wins and a problem explains why. Returns the
    topology and the problems found.
    """
    problems: list[str] = []
    count = len(connected)
    kind = classify(connected)
    if expected_kind is not None and expected_kind not in KINDS:
        problems.append(f"catalog topology {expected_kind!r} is not one of {', '.join(KINDS)}; ignoring it")
        expected_kind = None
    if kind is not None and (expected_kind is None or kind == expected_kind):
        return Topology(kind, count, tuple(tuple(sorted(c)) for c in connected), "connected_devices"), problems
    seen = "no regular topology" if kind is None else f"a {kind}"
    if expected_kind is not None:
        problems.append(f"{where} describe {seen} but the instance catalog says {expected_kind}; using the catalog")
        neigh = (tuple(tuple(sorted(c)) for c in expected_connected) if len(expected_connected) == count
                 else regular_neighbours(expected_kind, count))
        if classify(neigh) != expected_kind:
            neigh = regular_neighbours(expected_kind, count)
        if classify(neigh) != expected_kind:
            problems.append(f"catalog topology {expected_kind} does not fit {count} devices; treating them as "
                            "unconnected")
            return Topology("none", count, tuple(() for _ in range(count)), "fallback"), problems
        return Topology(expected_kind, count, neigh, "catalog"), problems
    problems.append(f"{where} describe {seen} and the instance type is not in the catalog; treating the devices "
                    "as unconnected")
    return Topology("none", count, tuple(() for _ in range(count)), "fallback"), problems
