"""Topology-aware preferred allocation for EFA devices (pure; no I/O).

Each device has a *topology path* from coarse to fine: ``(NUMA node, PCIe root)`` on GPU and CPU hosts, and
``(Neuron group of 8, Neuron group of 4)`` on Trainium, where the mapping tables, not the PCIe root, say which EFA
serves which Neuron devices. The leaf groups (PCIe roots / Neuron groups of 4) are the *accelerator groups*.

A request picks the selection that minimises, in this order:

1. the number of accelerator groups it touches, then the number of coarser groups (NUMA nodes) it touches;
2. the number of fully free groups it breaks (finest level first), so whole groups stay whole for later requests;
3. the free devices left behind in the groups it touches (best fit: finish partly used groups first);

and, among equals, the lowest PCI addresses. Because the cost is a sum over groups, an exact dynamic programme
over the group tree finds the optimum quickly (a few hundred combinations on p5.48xlarge).

Consequence used by the tests: with 4 EFAs per root (p5), a request for k x 4 devices while at least k roots are
wholly free touches exactly k roots, i.e. it gets k whole roots, since no fewer roots can hold 4k devices.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from efa_plugin.discovery import EfaDevice

Cost = int  #: the cost vector packed into one integer (see _charge); lexicographic order == integer order
_Option = tuple[Cost, tuple[str, ...]]

LEVELS = 2  # every topology path has this many components (coarse, fine)


def topology_path(dev: EfaDevice) -> tuple[str, str]:
    """``(coarse, fine)`` group keys for a device; devices with unknown placement each form their own group."""
    if dev.near_neurons:
        first = min(dev.near_neurons)
        return f"neuron-group8:{first // 8:02d}", f"neuron-group4:{first // 4:02d}"
    numa = f"numa:{dev.numa_node:02d}" if dev.numa_node is not None else "numa:none"
    fine = f"root:{dev.pcie_root}" if dev.pcie_root else f"device:{dev.id}"
    return numa, fine


@dataclass
class _Group:
    """A node of the group tree: ``level`` 0 is coarse, LEVELS-1 is an accelerator group holding devices."""

    key: str
    level: int
    children: dict[str, _Group] = field(default_factory=dict)
    members: list[str] = field(default_factory=list)  #: all inventory devices below (sorted)


#: remembered preferred-allocation answers per inventory (a cleared dict when full: cheap and bounded)
MEMO_SIZE = 256


class Topology:
    """The group tree of one inventory; build once per inventory and reuse for every request."""

    def __init__(self, devices: Iterable[EfaDevice]) -> None:
        self.top = _Group("", -1)
        self.known: set[str] = set()
        for dev in sorted(devices, key=lambda d: d.id):
            self.known.add(dev.id)
            node = self.top
            node.members.append(dev.id)
            for level, key in enumerate(topology_path(dev)):
                node = node.children.setdefault(key, _Group(key, level))
                node.members.append(dev.id)
        self.group_of = {m: self._leaf_key(m) for m in self.known}
        self._memo: dict[tuple[frozenset[str], tuple[str, ...], int], list[str]] = {}

    def _leaf_key(self, device_id: str) -> str:
        node = self.top
        while node.children:
            node = next(c for c in node.children.values() if device_id in c.members)
        return node.key

    def groups(self) -> dict[str, list[str]]:
        """Accelerator group key -> member IDs (for tests, benchmarks and ``ls``)."""
        out: dict[str, list[str]] = {}
        for device_id, key in self.group_of.items():
            out.setdefault(key, []).append(device_id)
        return {k: sorted(v) for k, v in sorted(out.items())}

    def preferred(self, available: Sequence[str], must_include: Sequence[str], size: int) -> list[str]:
        """``size`` IDs from ``available`` (plus ``must_include``), all of ``must_include`` first in priority.

        Unknown IDs are never preferred over known ones; if the request cannot be met (too few available), the
        answer holds every available ID, which the kubelet then rejects with its own message. Answers are
        remembered per (available set, must-include, size): the kubelet asks the same question for every pod until
        the free set changes, and the tree belongs to one inventory.
        """
        key = (frozenset(available), tuple(must_include), size)
        found = self._memo.get(key)
        if found is None:
            if len(self._memo) >= MEMO_SIZE:
                self._memo.clear()
            found = self._memo[key] = self._preferred(available, must_include, size)
        return list(found)

    def _preferred(self, available: Sequence[str], must_include: Sequence[str], size: int) -> list[str]:
        must = list(dict.fromkeys(must_include))
        if size <= len(must):
            return must
        free = set(available) | set(must)
        must_known = {m for m in must if m in self.known}
        must_unknown = [m for m in must if m not in self.known]
        need = size - len(must_unknown)
        known_free = free & self.known
        # the programme's work grows with need squared: more than the free known devices cannot be met anyway
        best = self._options(self.top, known_free, must_known, need)[need] if need <= len(known_free) else None
        # not enough known devices: take all of them, then unknown ones in order
        chosen = list(best[1]) if best is not None else sorted(known_free)
        result = must_unknown + chosen
        if len(result) < size:
            taken = set(result)
            result += sorted(a for a in dict.fromkeys(available) if a not in self.known and a not in taken)
        return result[:size]

    # -- the dynamic programme -----------------------------------------------------------------------------------
    def _options(self, node: _Group, free: set[str], must: set[str], cap: int) -> list[_Option | None]:
        """Best (cost, ids) for taking exactly k devices below ``node``, for k = 0..cap (None: impossible)."""
        if not node.children:
            return self._leaf_options(node, free, must, cap)
        acc: list[_Option | None] = [(0, ())] + [None] * cap
        for key in sorted(node.children):
            child = self._options(node.children[key], free, must, cap)
            merged: list[_Option | None] = [None] * (cap + 1)
            # child counts outermost and strict '<': on a tie the earlier groups (lower addresses) keep the devices
            for k2, right in enumerate(child):
                if right is None:
                    continue
                for k1, left in enumerate(acc[: cap - k2 + 1]):
                    if left is None:
                        continue
                    cost = left[0] + right[0]
                    current = merged[k1 + k2]
                    if current is None or cost < current[0]:
                        merged[k1 + k2] = (cost, left[1] + right[1])
            acc = merged
        if node.level < 0:
            return acc
        n_free = sum(1 for m in node.members if m in free)
        return [None if opt is None else (_charge(opt[0], node, k, n_free), opt[1]) for k, opt in enumerate(acc)]

    @staticmethod
    def _leaf_options(node: _Group, free: set[str], must: set[str], cap: int) -> list[_Option | None]:
        forced = [m for m in node.members if m in must]
        rest = [m for m in node.members if m in free and m not in must]
        out: list[_Option | None] = [None] * (cap + 1)
        n_free = len(forced) + len(rest)
        for k in range(len(forced), min(n_free, cap) + 1):
            out[k] = (_charge(0, node, k, n_free), tuple(forced + rest[: k - len(forced)]))
        return out


_BITS = 16  # each cost component stays far below 2**16 (it is bounded by the number of devices)
_WEIGHTS = tuple(1 << (_BITS * (3 * LEVELS - 1 - i)) for i in range(3 * LEVELS))


def _charge(cost: Cost, node: _Group, k: int, n_free: int) -> Cost:
    """Add this group's own terms when ``k`` of its ``n_free`` free devices are taken.

    The cost vector is (groups touched, whole groups broken, free devices left in touched groups), each block
    finest level first; it is packed into one integer, most significant component first.
    """
    if k == 0:
        return cost
    rank = LEVELS - 1 - node.level
    cost += _WEIGHTS[rank]  # a group touched
    if n_free == len(node.members) and k < n_free:
        cost += _WEIGHTS[LEVELS + rank]  # a whole group broken
    return cost + _WEIGHTS[2 * LEVELS + rank] * (n_free - k)  # free devices left behind in a touched group
