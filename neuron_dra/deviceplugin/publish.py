"""Publish what is in use on this node as the ``neuron.amazonaws.com/device-usage`` annotation of its own Node.

The truth stays where it is (Allocate records and the kubelet's PodResources, see usage.py); this only copies it
onto the Node through :class:`~accel_core.ownnode.OwnNode` whenever it changes, for the scheduler extender.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import replace

from accel_core.hostfiles import parse_index
from accel_core.ownnode import OwnNode
from neuron_dra.deviceplugin.inuse import NEURON, NEURONCORE
from neuron_dra.deviceplugin.node import NeuronNode
from neuron_dra.usage_annotation import USAGE_ANNOTATION, DeviceUsage


def _ints(ids: frozenset[str]) -> frozenset[int]:
    return frozenset(n for i in ids if (n := parse_index(i)) is not None)


def current_usage(node: NeuronNode) -> DeviceUsage:
    """The node's device-usage document now (generation and time left at 0)."""
    inv = node.inventory
    pods = {name: {"neuron": tuple(sorted(_ints(res.get(NEURON, frozenset())))),
                   "neuroncore": tuple(sorted(_ints(res.get(NEURONCORE, frozenset()))))}
            for name, res in node.usage.pods.items()}
    return DeviceUsage(
        topology_kind=inv.topology.kind, devices=len(inv.devices), cores_per_device=node.cores_per_device,
        neuron=_ints(node.usage.in_use(NEURON)), neuroncore=_ints(node.usage.in_use(NEURONCORE)),
        unhealthy=frozenset(d.index for d in inv.devices if not node.health.healthy(d.index)),
        pods=pods, instance_type=inv.instance_type, pending=node.usage.pending_count(),
    )


class UsagePublisher:
    """Calls :meth:`publish` after every change; a new generation is written only when the content changed."""

    def __init__(self, node: NeuronNode, own: OwnNode, clock: Callable[[], float] = time.time) -> None:
        self.node = node
        self.own = own
        self.generation = 0
        self._clock = clock
        self._last: dict[str, object] | None = None

    def publish(self) -> None:
        usage = current_usage(self.node)
        content = usage.content()
        if content == self._last:
            return
        self._last = content
        self.generation += 1
        doc = replace(usage, generation=self.generation, updated=self._clock())
        self.own.want(annotations={USAGE_ANNOTATION: doc.to_json()})
