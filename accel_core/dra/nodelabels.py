"""Device attributes that come from the driver's own Node's labels, on every device it publishes.

A profile names the labels it maps (``Scan.node_label_attributes``: label key -> attribute name in the driver's
domain); both AWS drivers use :data:`AWS_TOPOLOGY_LABELS`, the attributes AWS's Neuron DRA driver publishes from
EC2 instance topology and Capacity Blocks. A label that is absent (or empty) gives no attribute.

:class:`NodeLabelWatch` reads the Node once, then follows it with one watch (``fieldSelector
metadata.name=<node>``) resumed from the last resourceVersion, re-reading only after an error (with backoff) or when
the version is too old (410). Its cost is one watch per node; the scheduler reads nothing extra. It calls
``on_change`` only when the mapped attributes change, so the Node's status updates cost no slice write. It is the
driver's one view of its Node: the last copy seen (``node``) and a wake-up on each (``seen``) also serve the start's
wait for a device plugin to leave the Node's allocatable, the slices' owner reference and the keys the driver owns on
its Node (:meth:`accel_core.ownnode.OwnNode.observe`), so none of them sends a request of its own.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from accel_core.backoff import Backoff, wait_or_stop
from accel_core.dra.slicemodel import MAX_ATTRIBUTE_STRING, MAX_ATTRIBUTES_AND_CAPACITIES, SliceDevice
from accel_core.logs import kv
from accel_core.watch import STOP, wake

if TYPE_CHECKING:
    from lightkube import AsyncClient

log = logging.getLogger(__name__)

#: Seconds the first slice write waits for the first read of the Node (then it goes without the label attributes).
NODE_LABELS_WAIT_S = 5.0

#: EC2 instance topology and Capacity Block labels -> the attribute names AWS's Neuron DRA driver gives them.
AWS_TOPOLOGY_LABELS: Mapping[str, str] = {
    "topology.k8s.aws/network-node-layer-1": "networkNodeLayer1",
    "topology.k8s.aws/network-node-layer-2": "networkNodeLayer2",
    "topology.k8s.aws/network-node-layer-3": "networkNodeLayer3",
    "topology.k8s.aws/capacity-block-id": "capacityBlockId",
}


def label_attributes(labels: Mapping[str, str] | None, mapping: Mapping[str, str]) -> dict[str, str]:
    """The string attributes ``mapping`` makes of ``labels`` (absent or empty labels give none)."""
    labels = labels or {}
    return {attr: labels[label][:MAX_ATTRIBUTE_STRING] for label, attr in mapping.items() if labels.get(label)}


def with_attributes(devices: Sequence[SliceDevice], extra: Mapping[str, str]) -> list[SliceDevice]:
    """``devices`` with ``extra`` added to each; a device's own attribute of the same name wins, and a device with
    no room left (32 attributes and capacities) keeps what it has. A device with a ``node_label_gate`` is left out
    unless ``extra`` gives that attribute the value ``true`` (devices a node pool opts in to by a Node label), and
    so is each counter consumption its ``consumes_gates`` names."""
    devices = [_gated(d, extra) for d in devices if d.node_label_gate is None or extra.get(d.node_label_gate) == "true"]
    if not extra:
        return devices
    out = []
    for dev in devices:
        add = {k: v for k, v in extra.items() if k not in dev.attributes}
        room = MAX_ATTRIBUTES_AND_CAPACITIES - len(dev.attributes) - len(dev.capacity)
        if add and len(add) <= room:
            dev = dataclasses.replace(dev, attributes={**dev.attributes, **add})
        out.append(dev)
    return out


def _gated(dev: SliceDevice, extra: Mapping[str, str]) -> SliceDevice:
    closed = [cs for cs, gate in dev.consumes_gates.items() if extra.get(gate) != "true"]
    if not closed:
        return dev
    return dataclasses.replace(dev, consumes={cs: c for cs, c in dev.consumes.items() if cs not in closed})


class NodeLabelWatch:
    """Follows the labels ``mapping`` names on Node ``node_name``; ``attributes`` is what they give now."""

    def __init__(self, client: AsyncClient, node_name: str, mapping: Mapping[str, str],
                 on_change: Callable[[], None], *, backoff_initial: float = 0.5, backoff_max: float = 30.0) -> None:
        self.client = client
        self.node_name = node_name
        self.mapping = dict(mapping)
        self.on_change = on_change
        self.attributes: dict[str, str] = {}
        self.read = asyncio.Event()  #: set once the Node was read (or could not be: see :meth:`run`)
        self.node: Any = None  #: the last copy of the Node read or watched (None until one was)
        self.seen = asyncio.Event()  #: set on every copy of the Node (a waiter clears it, then waits)
        self.observers: list[Callable[[Any], None]] = []  #: called with every copy of the Node
        self.requests = 0  #: GETs and watch requests sent (the watch's own reconnects are lightkube's)
        self._backoff = Backoff(backoff_initial, backoff_max)
        self._version: str | None = None  # the last resourceVersion seen: a new watch resumes from it

    def _seen(self, node: Any) -> None:
        self.node = node
        self.seen.set()
        for observe in self.observers:
            observe(node)
        labels = node.metadata.labels if node.metadata else None
        attrs = label_attributes(labels, self.mapping)
        if attrs != self.attributes:
            log.info("node labels changed the device attributes",
                     extra=kv(node=self.node_name, attributes=attrs or None))
            self.attributes = attrs
            self.on_change()

    async def run(self, stop: asyncio.Event) -> None:
        """Follow the Node until ``stop`` (returns at once then); never raises for API errors (logged, retried
        with backoff)."""
        from lightkube import ApiError

        while not stop.is_set():
            follow = asyncio.create_task(self._follow())
            try:
                if await wake(stop, tasks=(follow,)) == STOP:
                    return
                follow.result()
            except Exception as exc:  # the API is away, refused us, or our version is too old (410 Gone)
                if isinstance(exc, ApiError) and exc.status.code == 410:
                    self._version = None
                delay = self._backoff.next()
                self.read.set()  # publishing must not wait for a Node we cannot read
                log.warning("cannot follow our Node's labels; retrying", extra=kv(
                    node=self.node_name, error=repr(exc)[:300], retry_in=round(delay, 2)))
                await wait_or_stop(stop, delay)
            finally:
                follow.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await follow

    async def _follow(self) -> None:
        """Read the Node (unless a version to resume from is known), then watch it from that version."""
        from lightkube.resources.core_v1 import Node

        if self._version is None:
            self.requests += 1
            node = await self.client.get(Node, self.node_name)
            self._seen(node)
            self.read.set()
            self._version = node.metadata.resourceVersion if node.metadata else None
        self.requests += 1
        async for event, node in self.client.watch(Node, fields={"metadata.name": self.node_name},
                                                   resource_version=self._version):
            self._backoff.reset()
            if node.metadata and node.metadata.resourceVersion:
                self._version = node.metadata.resourceVersion
            if event != "DELETED":
                self._seen(node)
