"""The two device-plugin policies: ``aws.amazon.com/neuron`` (whole devices) and ``aws.amazon.com/neuroncore``.

They share one :class:`~neuron_dra.deviceplugin.node.NeuronNode`. Each marks the IDs the *other* resource holds
Unhealthy (a device with a core in use is not offered as a whole device; the cores of a device in use are not
offered as cores), leaves them out of preferred allocations, and refuses them in Allocate.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from functools import lru_cache

from prometheus_client import CollectorRegistry, Counter

from accel_core.deviceplugin import AdvertisedDevice, AllocationError
from accel_core.edits import ContainerEdits
from accel_core.hostfiles import parse_index
from accel_core.logs import kv
from neuron_dra.allocation import Choice, choose_cores, choose_devices
from neuron_dra.deviceplugin.inuse import NEURON, NEURONCORE
from neuron_dra.deviceplugin.node import NeuronNode
from neuron_dra.deviceplugin.options import NEURON_SOCKET, NEURONCORE_SOCKET
from neuron_dra.edits import container_edits

log = logging.getLogger(__name__)



class PolicyMetrics:
    """Counters both policies share."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        reg = registry if registry is not None else CollectorRegistry()
        self.preferred = Counter("neuron_device_plugin_preferred_allocations_total",
                                 "GetPreferredAllocation answers by whether they were a connected/packed set",
                                 ["resource", "result"], registry=reg)
        self.refused = Counter("neuron_device_plugin_double_allocations_refused_total",
                               "Allocate calls refused because the other resource holds the same device",
                               ["resource"], registry=reg)


@lru_cache(maxsize=8)
def _canonical_ids(limit: int) -> dict[str, int]:
    """The IDs we advertise (``"0"`` .. ``str(limit - 1)``), looked up without parsing."""
    return {str(i): i for i in range(limit)}


def parse_ids(ids: Sequence[str], resource: str, limit: int) -> list[int]:
    """Kubelet IDs -> integers in ``0..limit-1``; AllocationError naming the first bad ID."""
    known = _canonical_ids(limit)
    out = []
    for raw in ids:
        number = known.get(raw)
        if number is not None:
            out.append(number)
            continue
        number = parse_index(raw, maximum=max(0, limit - 1))
        if number is None or number >= limit:
            raise AllocationError(f"{resource}: {raw[:40]!r} is not a valid ID on this node (0..{limit - 1})")
        out.append(number)
    return out


def check_size(size: int, resource: str, limit: int) -> None:
    """AllocationError unless ``size`` is within the ``limit`` IDs this node has for ``resource``."""
    if not 0 <= size <= limit:
        raise AllocationError(f"{resource}: allocation size {size} is not within the {limit} IDs on this node")


class _Base:
    resource_name: str
    socket_name: str

    def __init__(self, node: NeuronNode, metrics: PolicyMetrics | None = None) -> None:
        self.node = node
        self.metrics = metrics or PolicyMetrics()

    def advertise_blocked(self) -> str | None:
        return self.node.blocked()

    def _record(self, ids: Sequence[str]) -> None:
        self.node.usage.record_allocate(self.resource_name, ids)
        self.node.notify()

    def _note_choice(self, choice: Choice, size: int) -> None:
        result = "connected" if choice.connected else "not_connected"
        self.metrics.preferred.labels(self.resource_name, result).inc()
        if not choice.connected and choice.reason:
            log.info("preferred allocation is not a connected set",
                     extra=kv(resource=self.resource_name, size=size, ids=",".join(map(str, choice.ids)),
                              reason=choice.reason))


class NeuronDevicePolicy(_Base):
    """``aws.amazon.com/neuron``: ID = device index; a container gets whole devices and all their cores."""

    resource_name = NEURON
    socket_name = NEURON_SOCKET

    def devices(self) -> Sequence[AdvertisedDevice]:
        busy = self.node.devices_used_by_cores()
        return [AdvertisedDevice(str(d.index), self.node.health.healthy(d.index) and d.index not in busy,
                                 d.numa_node) for d in self.node.inventory.devices]

    def preferred(self, available: Sequence[str], must_include: Sequence[str], size: int) -> list[str]:
        inv = self.node.inventory
        limit = len(inv.devices)
        check_size(size, NEURON, limit)
        avail = parse_ids(available, NEURON, limit)
        must = parse_ids(must_include, NEURON, limit)
        busy = self.node.devices_used_by_cores()
        usable = [d for d in avail if d not in busy]
        if len(set(usable) | set(must)) < size:
            usable = avail
        choice = choose_devices(inv.topology, usable, must, size)
        self._note_choice(choice, size)
        return [str(i) for i in choice.ids]

    def allocate(self, ids: Sequence[str]) -> ContainerEdits:
        inv = self.node.inventory
        devices = parse_ids(ids, NEURON, len(inv.devices))
        busy = self.node.devices_used_by_cores()
        clash = {d: busy[d] for d in devices if d in busy}
        if clash:
            self.metrics.refused.labels(NEURON).inc()
            detail = "; ".join(f"device {d} has cores {c} in use" for d, c in sorted(clash.items()))
            raise AllocationError(f"{NEURON}: refusing devices {sorted(clash)}: {detail} through {NEURONCORE}")
        self._record(ids)
        cores = [c for d in devices for c in self.node.core_ids(d)]
        return container_edits(devices, cores, cores_per_device=self.node.cores_per_device,
                               lnc=inv.lnc if inv.lnc_applies else None, numbering=self.node.numbering)


class NeuronCorePolicy(_Base):
    """``aws.amazon.com/neuroncore``: ID = global logical core; a container gets the whole /dev nodes involved."""

    resource_name = NEURONCORE
    socket_name = NEURONCORE_SOCKET

    def devices(self) -> Sequence[AdvertisedDevice]:
        busy = self.node.devices_used_whole()
        out = []
        for d in self.node.inventory.devices:
            healthy = self.node.health.healthy(d.index) and d.index not in busy
            out += [AdvertisedDevice(str(c), healthy, d.numa_node) for c in self.node.core_ids(d.index)]
        return out

    def preferred(self, available: Sequence[str], must_include: Sequence[str], size: int) -> list[str]:
        inv = self.node.inventory
        per = self.node.cores_per_device
        limit = inv.total_logical_cores()
        check_size(size, NEURONCORE, limit)
        avail = parse_ids(available, NEURONCORE, limit)
        must = parse_ids(must_include, NEURONCORE, limit)
        busy = self.node.devices_used_whole()
        usable = [c for c in avail if c // per not in busy]
        if len(set(usable) | set(must)) < size:
            usable = avail
        choice = choose_cores(inv.topology, per, usable, must, size)
        self._note_choice(choice, size)
        return [str(i) for i in choice.ids]

    def allocate(self, ids: Sequence[str]) -> ContainerEdits:
        inv = self.node.inventory
        per = self.node.cores_per_device
        cores = parse_ids(ids, NEURONCORE, inv.total_logical_cores())
        devices = sorted({c // per for c in cores})
        busy = self.node.devices_used_whole()
        clash = [d for d in devices if d in busy]
        if clash:
            self.metrics.refused.labels(NEURONCORE).inc()
            raise AllocationError(f"{NEURONCORE}: refusing cores {sorted(c for c in cores if c // per in busy)}: "
                                  f"devices {clash} are in use through {NEURON}")
        self._record(ids)
        return container_edits(devices, cores, cores_per_device=per,
                               lnc=inv.lnc if inv.lnc_applies else None, numbering=self.node.numbering)
