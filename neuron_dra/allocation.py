"""Preferred allocation: connected device sets and packed NeuronCores. Pure functions over a topology, shared by the
device plugin (GetPreferredAllocation) and the scheduler extender (placement).

Devices: among the free connected sets of the requested size that hold every must-include device (aligned torus
groups of 1/4/8/16, connected subsets of one aligned block for other sizes, runs of neighbours on a ring or
chain) pick the *best fit*: the one whose surrounding blocks (torus) or free run (ring/chain) have the fewest
other free devices, so large connected sets stay free for later requests. When no connected set is free, grow
the largest connected piece possible and say why.

Cores: fill the devices the must-include cores are on, then whole free devices (as a connected set) for each
full device's worth, then the remainder on the device with the fewest free cores that still fits it (packing),
as a contiguous run of core indices where possible.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from neuron_dra.topology import Topology, mask_of, members


@dataclass(frozen=True)
class Choice:
    """A preferred allocation: IDs (ascending), whether it is a connected set, and why not if it is not."""

    ids: tuple[int, ...]
    connected: bool
    reason: str = ""


def _popcount(mask: int) -> int:
    return mask.bit_count()


def _fit_key(topology: Topology, mask: int, free: int, size: int) -> tuple[int, ...]:
    """Lower is better: how many *other* free devices share this set's surroundings."""
    others = free & ~mask
    if topology.kind == "torus4x4":
        lowest = (mask & -mask).bit_length() - 1
        key = []
        for group in (4, 8, 16):
            if group > size:
                start = (lowest // group) * group
                block = ((1 << group) - 1) << start
                key.append(_popcount(others & block))
        return (*key, lowest)
    if topology.kind in ("ring", "chain"):
        near = 0
        for i in members(mask):
            for j in topology.neighbours[i]:
                if others >> j & 1:
                    near |= 1 << j
        return (_popcount(near), _segment_length(topology, mask, free), (mask & -mask).bit_length())
    return ((mask & -mask).bit_length(),)


def _segment_length(topology: Topology, mask: int, free: int) -> int:
    """Size of the free connected piece that contains ``mask``."""
    seen = mask
    todo = list(members(mask))
    while todo:
        cur = todo.pop()
        for nxt in topology.neighbours[cur]:
            bit = 1 << nxt
            if free & bit and not seen & bit:
                seen |= bit
                todo.append(nxt)
    return _popcount(seen)


def choose_devices(topology: Topology, available: Iterable[int], must: Iterable[int], size: int) -> Choice:
    """Pick ``size`` devices from ``available`` including ``must`` (see the module docstring)."""
    must_mask = mask_of(must)
    free = mask_of(available) | must_mask
    if size <= _popcount(must_mask):
        return Choice(members(must_mask), topology.is_connected(members(must_mask)))
    best: tuple[tuple[int, ...], int] | None = None
    for mask in topology.candidate_masks(size):
        if mask & free == mask and mask & must_mask == must_mask:
            key = _fit_key(topology, mask, free, size)
            if best is None or key < best[0]:
                best = (key, mask)
    if best is not None:
        return Choice(members(best[1]), True)
    ids = _grow(topology, free, must_mask, size)
    if size == 1 or topology.kind in ("single", "none"):
        return Choice(ids, len(ids) <= 1, "" if len(ids) <= 1 else f"{topology.kind} topology has no links")
    why = (f"no free connected set of {size} devices on this {topology.kind} topology"
           + (f" including {list(members(must_mask))}" if must_mask else "")
           + f" (free: {list(members(free))}); returning the most connected devices available")
    return Choice(ids, False, why)


def _grow(topology: Topology, free: int, chosen: int, size: int) -> tuple[int, ...]:
    """Greedy: start from ``chosen`` (or the free device with most free neighbours), add the best-linked device."""
    pool = free & ~chosen
    if not chosen and pool:
        chosen = 1 << max(members(pool), key=lambda i: (_segment_length(topology, 1 << i, free), -i))
        pool &= ~chosen
    while _popcount(chosen) < size and pool:
        nxt = min(members(pool), key=lambda i, c=chosen: _link_score(topology, c, i))  # type: ignore[misc]
        chosen |= 1 << nxt
        pool &= ~(1 << nxt)
    return members(chosen)


def _link_score(topology: Topology, chosen: int, i: int) -> tuple[int, int, int]:
    """Lower is better: most links into ``chosen``, then nearest index, then lowest index."""
    links = sum(1 for j in topology.neighbours[i] if chosen >> j & 1) if i < len(topology.neighbours) else 0
    return (-links, min(abs(i - j) for j in members(chosen)), i)


def _contiguous(free: Sequence[int], count: int) -> list[int]:
    """``count`` cores from the sorted ``free`` list, as a run of consecutive indices when one exists."""
    for start in range(len(free) - count + 1):
        window = free[start:start + count]
        if window[-1] - window[0] == count - 1:
            return list(window)
    return list(free[:count])


def choose_cores(
    topology: Topology, cores_per_device: int, available: Iterable[int], must: Iterable[int], size: int
) -> Choice:
    """Pick ``size`` global core indices (device ``c // cores_per_device``) from ``available`` including ``must``."""
    chosen = sorted(set(must))
    if size <= len(chosen) or cores_per_device <= 0:
        return Choice(tuple(chosen), True)
    taken = set(chosen)
    free: dict[int, list[int]] = {}
    for core in sorted(set(available) - taken):
        free.setdefault(core // cores_per_device, []).append(core)
    need = size - len(chosen)

    # 1. the devices the must-include cores are on, nearest cores first
    for dev in sorted({c // cores_per_device for c in chosen}):
        pool = free.pop(dev, [])
        anchor = [c for c in chosen if c // cores_per_device == dev]
        pool.sort(key=lambda c, a=anchor: (min(abs(c - x) for x in a), c))  # type: ignore[misc]
        chosen += pool[:need]
        need = size - len(chosen)
        if need <= 0:
            break

    # 2. whole free devices, as a connected set, for each full device's worth
    whole = [d for d, cores in free.items() if len(cores) == cores_per_device]
    full = min(need // cores_per_device, len(whole))
    if full:
        for dev in choose_devices(topology, whole, (), full).ids[:full]:
            chosen += free.pop(dev)
        need = size - len(chosen)

    # 3. the remainder on the tightest device that fits it, then spread over the fullest-free devices
    while need > 0 and free:
        fits = [d for d, cores in free.items() if len(cores) >= need]
        dev = (min(fits, key=lambda d: (len(free[d]), d)) if fits
               else max(free, key=lambda d: (len(free[d]), -d)))
        pick = _contiguous(free.pop(dev), min(need, cores_per_device))
        chosen += pick
        need = size - len(chosen)

    ids = tuple(sorted(chosen))
    devices = sorted({c // cores_per_device for c in ids})
    minimum = -(-len(ids) // cores_per_device)
    packed = len(devices) <= max(minimum, len({c // cores_per_device for c in must}))
    connected = packed and (len(devices) <= 1 or topology.is_connected(devices))
    reason = "" if connected else (f"cores span devices {devices}" + ("" if packed else
                                   f" where {minimum} would do") + " because no tighter set is free")
    return Choice(ids, connected, reason)
