"""Where a pod's Neuron requests would land on one node, decided by the device plugin's allocation policy.

A :class:`NodeState` is one node's free devices and cores (from its device-usage annotation). :func:`place` asks
:func:`~neuron_dra.allocation.choose_devices` / ``choose_cores`` -- the same code that answers the
kubelet's GetPreferredAllocation -- for each container in turn, exactly as the device plugin will be asked, and
says whether every container gets a connected set (and which), or names the set that is missing.

:func:`capacity` measures how much connected capacity a node has left (free devices in whole free aligned groups);
the extender scores a node by how much of it a placement keeps (least fragmentation).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from neuron_dra.allocation import choose_cores, choose_devices
from neuron_dra.topology import Topology, mask_of
from neuron_dra.usage_annotation import NEURON, NEURONCORE, DeviceUsage
from neuron_dra.usage_annotation import RESOURCES as RESOURCES

MAX_SCORE = 10


@dataclass(frozen=True)
class Request:
    """One container's Neuron request: ``count`` IDs of ``resource``."""

    container: str
    resource: str
    count: int


@dataclass(frozen=True)
class NodeState:
    """A node's Neuron devices and what is taken (device indices; global logical core indices)."""

    topology: Topology
    cores_per_device: int
    used_devices: frozenset[int] = frozenset()
    used_cores: frozenset[int] = frozenset()
    unhealthy: frozenset[int] = frozenset()

    @classmethod
    def from_usage(cls, usage: DeviceUsage) -> NodeState:
        return cls(usage.topology(), usage.cores_per_device, usage.neuron, usage.neuroncore, usage.unhealthy)

    def devices_with_cores_in_use(self) -> set[int]:
        per = self.cores_per_device
        return {c // per for c in self.used_cores} if per else set()

    def free_devices(self) -> list[int]:
        """Devices ``aws.amazon.com/neuron`` can hand out: healthy, not in use, no core of them in use."""
        busy = self.used_devices | self.unhealthy | self.devices_with_cores_in_use()
        return [d for d in range(self.topology.device_count) if d not in busy]

    def free_cores(self) -> list[int]:
        """Cores ``aws.amazon.com/neuroncore`` can hand out: on healthy devices not in use whole, core not in use."""
        per = self.cores_per_device
        busy = self.used_devices | self.unhealthy
        return [c for c in range(self.topology.device_count * per)
                if c // per not in busy and c not in self.used_cores]

    def take(self, resource: str, ids: Iterable[int]) -> NodeState:
        if resource == NEURON:
            return NodeState(self.topology, self.cores_per_device, self.used_devices | frozenset(ids),
                             self.used_cores, self.unhealthy)
        return NodeState(self.topology, self.cores_per_device, self.used_devices,
                         self.used_cores | frozenset(ids), self.unhealthy)


@dataclass(frozen=True)
class Placement:
    """The outcome of placing a pod's requests: ``ok``, the IDs per container, the state after, or why not."""

    ok: bool
    state: NodeState
    ids: tuple[tuple[Request, tuple[int, ...]], ...] = ()
    reason: str = ""
    detail: str = ""


def _unit(resource: str, count: int) -> str:
    noun = "device" if resource == NEURON else "NeuronCore"
    return f"{count} {resource} {noun}{'s' if count != 1 else ''}"


def place_one(state: NodeState, request: Request) -> tuple[tuple[int, ...] | None, str, str]:
    """(IDs, "", "") when the request gets a connected set; (None, reason, detail) otherwise."""
    size = request.count
    top = state.topology
    if request.resource == NEURON:
        free = state.free_devices()
        if size > top.device_count:
            return None, f"{_unit(NEURON, size)} is more than a node's {top.device_count}", ""
        if len(free) < size:
            return None, f"no free connected set of {_unit(NEURON, size)}", f"only {len(free)} devices are free: {free}"
        choice = choose_devices(top, free, (), size)
        if not choice.connected:
            return None, f"no free connected set of {_unit(NEURON, size)}", (
                f"free devices {free} on the {top.kind} topology hold no connected set of {size}")
        return choice.ids, "", ""
    per = state.cores_per_device
    free = state.free_cores()
    total = top.device_count * per
    if size > total:
        return None, f"{_unit(NEURONCORE, size)} is more than a node's {total}", ""
    if len(free) < size:
        return None, f"no free connected set of {_unit(NEURONCORE, size)}", f"only {len(free)} cores are free"
    choice = choose_cores(top, per, free, (), size)
    if not choice.connected:
        return None, f"no free connected set of {_unit(NEURONCORE, size)}", (
            f"{choice.reason} ({len(free)} cores free, {per} per device, {top.kind} topology)")
    return choice.ids, "", ""


def place(state: NodeState, requests: Sequence[Request]) -> Placement:
    """Place every container's request in order (as the kubelet allocates them)."""
    done: list[tuple[Request, tuple[int, ...]]] = []
    for request in requests:
        ids, reason, detail = place_one(state, request)
        if ids is None:
            prefix = f"container {request.container}: " if len(requests) > 1 else ""
            return Placement(False, state, tuple(done), prefix + reason, detail)
        done.append((request, ids))
        state = state.take(request.resource, ids)
    return Placement(True, state, tuple(done))


def capacity(state: NodeState) -> int:
    """Connected capacity left: for every group size above 1, the devices in wholly free aligned groups of that size
    (plain free devices on topologies without groups)."""
    free = mask_of(state.free_devices())
    top = state.topology
    sizes = [s for s in top.group_sizes if s > 1]
    if not sizes:
        return bin(free).count("1")
    total = 0
    for size in sizes:
        for group in top.connected_groups(size):
            mask = mask_of(group)
            if free & mask == mask:
                total += size
    return total


def score(before: NodeState, after: NodeState) -> int:
    """0..10: the share of the node's connected capacity the placement keeps (10 = nothing broken up)."""
    was = capacity(before)
    if was == 0:
        return MAX_SCORE
    return round(MAX_SCORE * capacity(after) / was)
