"""Publishing one node's ResourceSlices (resource.k8s.io/v1) for one DRA driver, with lightkube.

The driver says which devices it has (:meth:`SlicePublisher.set_devices`); the publisher keeps the API server in
line with that and nothing else:

- pool name = node name, ``spec.nodeName`` set, an owner reference to the Node (its UID looked up once), slices
  named ``<node>-<driver>-<random>`` by the API server;
- at most 128 devices per slice (64 when any device carries taints or consumes counters), and shared counters in
  slices of their own, at most 8 counter sets each, so a large pool spans several slices that all carry
  ``resourceSliceCount``;
- nothing is written before the driver hands over its first complete device list, and nothing while what the
  server holds already matches it (checked on start, after every watch event and every change), so an idle node
  causes no writes at all; a change writes every slice of the pool with the pool generation bumped;
- a change that keeps the same devices and counters (health: taints, and attributes such as an EFA's port state)
  is written at most once per ``min_write_interval`` seconds, the latest state then; the first write, and devices
  or counters that come or go, go out at once. A port flapping every 0.2 s costs a few writes a minute, not
  hundreds;
- the server's taints (with their ``timeAdded``) from the first listing are handed to ``on_listed`` before
  anything is written, so a restarted driver can keep them (:mod:`accel_core.dra.taints`);
- an API server that cannot be reached (connection refused or reset, 502/503/504 while it starts) is retried every
  0.5 s (jittered), so slices are back within a second of its return whatever the outage lasted; a dial costs it
  nothing. An API server that answers with an error is retried with exponential backoff (0.5 s doubling to 30 s),
  reset by the next successful sync. The pool is re-listed every time, so a half-written update is finished,
  never left behind as the newest generation;
- an API server that silently drops fields (device taints behind a disabled feature gate) is detected by
  comparing what it returned with what was sent. Taints then fall back to leaving the tainted devices
  (NoSchedule/NoExecute) out of the slice; other dropped fields are logged once and accepted.
The devices themselves, and their checks, are :mod:`accel_core.dra.slicemodel`.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import dataclasses
import json
import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import httpx2
import msgspec
from lightkube import ApiError, AsyncClient
from lightkube.core.exceptions import NotReadyError
from lightkube.models import resource_v1 as api
from lightkube.models.meta_v1 import ObjectMeta, OwnerReference
from lightkube.resources.core_v1 import Node
from lightkube.resources.resource_v1 import ResourceSlice
from prometheus_client import CollectorRegistry, Counter, Gauge

from accel_core.backoff import Backoff, wait_or_stop
from accel_core.dra.slicemodel import CounterSet, SliceDevice, Taint, quantity_value, validate_devices
from accel_core.logs import kv
from accel_core.watch import STOP, TASK, wake

log = logging.getLogger(__name__)

MAX_DEVICES_PER_SLICE = 128
MAX_DEVICES_PER_SLICE_WITH_TAINTS = 64
MAX_COUNTER_SETS_PER_SLICE = 8


def without_taints(devices: Sequence[SliceDevice]) -> list[SliceDevice]:
    """The fallback when taints cannot be published: devices tainted NoSchedule/NoExecute are left out."""
    out = []
    for d in devices:
        if any(t.effect in ("NoSchedule", "NoExecute") for t in d.taints):
            continue
        out.append(dataclasses.replace(d, taints=()))
    return out


def build_slices(
    driver: str,
    node_name: str,
    devices: Sequence[SliceDevice],
    *,
    generation: int = 1,
    node_uid: str | None = None,
    pool: str | None = None,
    counters: Sequence[CounterSet] = (),
) -> list[ResourceSlice]:
    """The ResourceSlice objects for one pool; no devices gives no slices.

    Shared ``counters`` go in slices of their own, first (a slice holds devices or counters, never both), at most
    8 counter sets each; a set no device consumes (one whose consumers a Node label keeps out) is left out.
    The owner reference to the Node is included when ``node_uid`` is known.
    """
    if not devices:
        return []
    consumed = {name for d in devices for name in d.consumes}
    counters = [c for c in counters if c.name in consumed]  # a set no device consumes: out
    limited = any(d.taints or d.consumes for d in devices)
    size = MAX_DEVICES_PER_SLICE_WITH_TAINTS if limited else MAX_DEVICES_PER_SLICE
    parts: list[tuple[list[api.Device] | None, list[api.CounterSet] | None]] = [
        (None, [c.to_api() for c in counters[i:i + MAX_COUNTER_SETS_PER_SLICE]])
        for i in range(0, len(counters), MAX_COUNTER_SETS_PER_SLICE)]
    parts += [([d.to_api() for d in devices[i:i + size]], None) for i in range(0, len(devices), size)]
    return [ResourceSlice(
        metadata=ObjectMeta(generateName=f"{node_name}-{driver}-", ownerReferences=[OwnerReference(
            apiVersion="v1", kind="Node", name=node_name, uid=node_uid, controller=True)] if node_uid else None),
        spec=api.ResourceSliceSpec(
            driver=driver, nodeName=node_name, devices=chunk, sharedCounters=shared,
            pool=api.ResourcePool(name=pool or node_name, generation=generation, resourceSliceCount=len(parts))),
    ) for chunk, shared in parts]


def _quantities(values: Mapping[str, Any] | None) -> dict[str, str]:
    """A capacity or counter map as normalized numbers. Its values are models when we built them and plain
    objects when lightkube decoded them (it types these maps as ``dict``); to_builtins makes both plain."""
    out = {}
    for key, value in msgspec.to_builtins(values or {}).items():
        text = str(value.get("value") if isinstance(value, dict) else value)
        try:
            out[key] = str(quantity_value(text).normalize())
        except ValueError:
            out[key] = text
    return out


def spec_key(spec: api.ResourceSliceSpec) -> str:
    """A canonical fingerprint of a slice spec, ignoring the pool generation, taint timestamps and quantity
    spelling (``96Gi`` equals ``103079215104``), so a slice read back compares equal to the one sent."""
    devices = sorted(({
        "name": d.name,
        "attributes": msgspec.to_builtins(d.attributes or {}),
        "capacity": _quantities(d.capacity),
        "taints": sorted((t.key, t.value or "", t.effect) for t in d.taints or []),
        "consumes": {c.counterSet: _quantities(c.counters) for c in d.consumesCounters or []},
    } for d in spec.devices or []), key=lambda x: x["name"])
    return json.dumps({
        "driver": spec.driver, "pool": spec.pool.name, "count": spec.pool.resourceSliceCount,
        "nodeName": spec.nodeName, "devices": devices,
        "counters": {c.name: _quantities(c.counters) for c in spec.sharedCounters or []},
    }, sort_keys=True)


def structure_key(devices: Sequence[SliceDevice], counters: Sequence[CounterSet]) -> tuple[object, ...]:
    """Which devices and counters a pool holds: equal keys mean the same devices changed (health, in practice)."""
    return (tuple(d.name for d in devices), tuple(counters))


def server_taints(slices: Sequence[ResourceSlice]) -> dict[str, tuple[Taint, ...]]:
    """The taints the server holds, by device name, with their ``timeAdded``."""
    return {d.name: tuple(Taint(t.key, t.value or "", t.effect, t.timeAdded) for t in d.taints)
            for o in slices for d in o.spec.devices or [] if d.taints}


def _has_taints(spec: api.ResourceSliceSpec) -> bool:
    return any(d.taints for d in spec.devices or [])


def _rv_newer(new: str | None, old: str | None) -> bool:
    """True unless ``new`` is provably older than ``old`` (resource versions compare as integers in practice)."""
    try:
        return int(new or 0) >= int(old or 0)
    except ValueError:
        return True


# -- publishing ------------------------------------------------------------------------------------------------
class PublisherMetrics:
    def __init__(self, registry: CollectorRegistry | None) -> None:
        reg = registry if registry is not None else CollectorRegistry()
        self.writes = Counter("accel_dra_resourceslice_writes_total", "ResourceSlice writes, by operation",
                              ["driver", "operation"], registry=reg)
        self.errors = Counter("accel_dra_resourceslice_sync_errors_total",
                              "Failed ResourceSlice syncs (API server away, conflicts, rejected writes)",
                              ["driver"], registry=reg)
        self.slices = Gauge("accel_dra_resourceslices_published", "ResourceSlices this driver holds for its pool",
                            ["driver"], registry=reg)
        self.devices = Gauge("accel_dra_resourceslice_devices_published", "Devices in the published pool",
                             ["driver"], registry=reg)
        self.generation = Gauge("accel_dra_resourceslice_pool_generation", "Generation of the published pool",
                                ["driver"], registry=reg)


class SlicePublisher:
    """Keeps the ResourceSlices of ``node_name``'s pool for ``driver`` equal to the devices it is given."""

    def __init__(
        self,
        client: AsyncClient,
        driver: str,
        node_name: str,
        *,
        registry: CollectorRegistry | None = None,
        backoff_initial: float = 0.5,
        backoff_max: float = 30.0,
        unreachable_retry: float = 0.5,
        min_write_interval: float = 0.0,
        on_listed: Callable[[dict[str, tuple[Taint, ...]]], None] | None = None,
    ) -> None:
        self.client = client
        self.driver = driver
        self.node_name = node_name
        self.metrics = PublisherMetrics(registry)
        self._backoff = Backoff(backoff_initial, backoff_max)
        self._unreachable = Backoff(unreachable_retry, unreachable_retry, factor=1)  # flat, jittered
        self.writes = 0
        self.reconciles = 0  # completed reconcile passes: lets a caller wait for one to have looked at a change
        #: None until a write with taints shows whether the API server keeps them.
        self.taints_supported: bool | None = None
        #: Set whenever the server holds exactly the current device list.
        self.published = asyncio.Event()
        self._desired: list[SliceDevice] | None = None
        self._counters: list[CounterSet] = []
        self._node_uid: str | None = None
        self._cache: dict[str, ResourceSlice] = {}
        self._accepted: dict[str, str] = {}  # server's version of a spec -> the spec we sent
        self._wake = asyncio.Event()
        self._failures = 0
        self._generation = 0
        self.min_write_interval = min_write_interval
        self.on_listed = on_listed
        self._written: tuple[float, tuple[object, ...]] | None = None  # loop time and structure of the last write
        self._due: float | None = None  # loop time a held-back health write is due

    @property
    def fields(self) -> dict[str, Any]:
        return {"spec.nodeName": self.node_name, "spec.driver": self.driver}

    @property
    def generation(self) -> int:
        return self._generation

    def know_node(self, node: Any) -> None:
        """Take the Node's UID (the slices' owner reference) from a copy the caller already has: no GET then."""
        if node.metadata is not None and node.metadata.uid:
            self._node_uid = node.metadata.uid

    def set_devices(self, devices: Sequence[SliceDevice], counters: Sequence[CounterSet] = ()) -> None:
        """The pool's complete device list (empty: publish no slices) and the counters its devices share.
        Raises SliceValidationError."""
        devices = list(devices)
        validate_devices(devices, counters)
        if devices == self._desired and list(counters) == self._counters:
            return
        self._desired = devices
        self._counters = list(counters)
        self.published.clear()
        self._wake.set()

    # -- loop ------------------------------------------------------------------------------------------------------
    async def run(self, stop: asyncio.Event) -> None:
        """Sync until ``stop`` is set; never raises for API errors (logs them and retries, see the module docstring)."""
        while not stop.is_set():
            try:
                await self._session(stop)
                return
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                self.metrics.errors.labels(self.driver).inc()
                self._failures += 1
                delay = self._retry_delay(exc)
                level = logging.WARNING if self._failures in (1, 5) or self._failures % 50 == 0 else logging.DEBUG
                log.log(level, "ResourceSlice sync failed; retrying", extra=kv(
                    driver=self.driver, node=self.node_name, error=_describe(exc), retry_in=round(delay, 2),
                    failures=self._failures))
                await wait_or_stop(stop, delay)

    def _retry_delay(self, exc: BaseException) -> float:
        """Seconds before the next attempt: quick for a conflict, short and flat while the server cannot be reached
        (nothing to overload, and it must be noticed soon after it returns), exponential when it answers with an
        error."""
        if _is_conflict(exc):
            return 0.05
        if _is_unreachable(exc):
            return self._unreachable.next()
        return self._backoff.next()

    async def _session(self, stop: asyncio.Event) -> None:
        if self._node_uid is None:
            node = await self.client.get(Node, self.node_name)
            self._node_uid = node.metadata.uid if node.metadata else None
        listing = self.client.list(ResourceSlice, fields=self.fields)
        self._cache = {_meta(obj).name or "": obj async for obj in listing}
        try:
            resource_version: str | None = listing.resourceVersion
        except NotReadyError:
            resource_version = None
        if self.on_listed is not None:
            hook, self.on_listed = self.on_listed, None  # once: what a restarted driver finds
            hook(server_taints(list(self._cache.values())))
        await self._reconcile()
        self.reconciles += 1
        if self._failures:
            log.info("ResourceSlice sync recovered", extra=kv(driver=self.driver, failures=self._failures))
        self._failures = 0
        self._backoff.reset()  # a success resets the backoff
        watch = asyncio.create_task(self._watch(resource_version))
        try:
            while True:
                timeout = None if self._due is None else max(0.0, self._due - asyncio.get_running_loop().time())
                woke = await wake(stop, self._wake, tasks=(watch,), timeout=timeout)
                if woke == STOP:
                    return
                if woke == TASK:
                    watch.result()
                    raise ConnectionError("ResourceSlice watch ended")
                self._wake.clear()
                await self._reconcile()
                self.reconciles += 1
        finally:
            watch.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await watch

    async def _watch(self, resource_version: str | None) -> None:
        async for event, obj in self.client.watch(ResourceSlice, fields=self.fields,
                                                  resource_version=resource_version):
            name = _meta(obj).name
            if not name:
                continue
            cached = self._cache.get(name)
            if event == "DELETED":
                self._cache.pop(name, None)
            elif cached is None or _rv_newer(_meta(obj).resourceVersion, _meta(cached).resourceVersion):
                self._cache[name] = obj
            self._wake.set()

    # -- reconcile ---------------------------------------------------------------------------------------------
    def _wanted_devices(self) -> list[SliceDevice]:
        assert self._desired is not None
        return self._desired if self.taints_supported is not False else without_taints(self._desired)

    def _in_sync(self, wanted: list[ResourceSlice]) -> bool:
        current = list(self._cache.values())
        if len(current) != len(wanted):
            return False
        if len({o.spec.pool.generation for o in current}) > 1:
            return False
        have = collections.Counter(self._accepted.get(k, k) for k in (spec_key(o.spec) for o in current))
        return have == collections.Counter(spec_key(w.spec) for w in wanted)

    async def _reconcile(self) -> None:
        if self._desired is None:
            return  # the driver has not said what it has yet: never publish a partial pool
        devices = self._wanted_devices()
        wanted = build_slices(self.driver, self.node_name, devices, node_uid=self._node_uid, counters=self._counters)
        self._generation = max([self._generation, *(o.spec.pool.generation for o in self._cache.values())])
        self._due = None
        if not self._in_sync(wanted):
            now = asyncio.get_running_loop().time()
            structure = structure_key(self._desired, self._counters)
            if (self._written is not None and self._written[1] == structure
                    and now < self._written[0] + self.min_write_interval):
                self._due = self._written[0] + self.min_write_interval  # health only: coalesce, latest state then
                return
            await self._write(wanted)
            self._written = (now, structure)
        self.metrics.slices.labels(self.driver).set(len(self._cache))
        self.metrics.devices.labels(self.driver).set(len(devices))
        self.metrics.generation.labels(self.driver).set(self._generation)
        self.published.set()

    async def _write(self, wanted: list[ResourceSlice]) -> None:
        generation = self._generation + 1
        existing = sorted(self._cache.values(), key=lambda o: _meta(o).name or "")
        for i, obj in enumerate(wanted):
            obj.spec.pool.generation = generation
            if i < len(existing):
                old = _meta(existing[i])
                obj.metadata = msgspec.structs.replace(_meta(obj), name=old.name, resourceVersion=old.resourceVersion,
                                                       generateName=None)
                result = await self.client.replace(obj)
                self._count("update")
            else:
                result = await self.client.create(obj)
                self._count("create")
            self._cache[_meta(result).name or ""] = result
            self._check_dropped(obj.spec, result.spec)
        for old_obj in existing[len(wanted):]:
            name = _meta(old_obj).name or ""
            with contextlib.suppress(ApiError):  # already gone is fine
                await self.client.delete(ResourceSlice, name)
            self._count("delete")
            self._cache.pop(name, None)
        self._generation = generation
        log.info("ResourceSlices published", extra=kv(
            driver=self.driver, node=self.node_name, generation=generation, slices=len(wanted),
            devices=sum(len(o.spec.devices or ()) for o in wanted)))

    def _check_dropped(self, sent: api.ResourceSliceSpec, got: api.ResourceSliceSpec) -> None:
        sent_key, got_key = spec_key(sent), spec_key(got)
        if sent_key == got_key:
            if _has_taints(sent):
                self.taints_supported = True
            return
        if _has_taints(sent) and not _has_taints(got):
            if self.taints_supported is not False:
                log.warning("the API server dropped device taints (DRADeviceTaints off?); unhealthy devices are "
                            "left out of the slice instead", extra=kv(driver=self.driver, node=self.node_name))
            self.taints_supported = False
            self._wake.set()
            return
        if got_key not in self._accepted:
            log.warning("the API server changed the ResourceSlice we wrote (fields dropped?); accepting its version",
                        extra=kv(driver=self.driver, slice=got.pool.name))
        self._accepted[got_key] = sent_key

    def _count(self, operation: str) -> None:
        self.writes += 1
        self.metrics.writes.labels(self.driver, operation).inc()

    # -- removal ---------------------------------------------------------------------------------------------------
    async def remove_all(self) -> int:
        """Delete this driver's slices for this node (not other drivers' or nodes'); returns how many."""
        names = [obj.metadata.name async for obj in self.client.list(ResourceSlice, fields=self.fields)
                 if obj.metadata is not None and obj.metadata.name]
        for name in names:
            with contextlib.suppress(ApiError):
                await self.client.delete(ResourceSlice, name)
            self._count("delete")
            self._cache.pop(name, None)
        log.info("ResourceSlices removed", extra=kv(driver=self.driver, node=self.node_name, slices=len(names)))
        return len(names)


def _meta(obj: ResourceSlice) -> ObjectMeta:
    return obj.metadata or ObjectMeta()


def _is_conflict(exc: BaseException) -> bool:
    return isinstance(exc, ApiError) and exc.status.code == 409


#: what a load balancer or an API server that is still starting answers while it cannot serve
_UNAVAILABLE = frozenset({502, 503, 504})


def _is_unreachable(exc: BaseException) -> bool:
    """The API server is not there (refused, reset, timed out, stream cut) or not serving yet."""
    if isinstance(exc, ApiError):
        return exc.status.code in _UNAVAILABLE
    if isinstance(exc, httpx2.HTTPStatusError):
        return exc.response.status_code in _UNAVAILABLE
    return isinstance(exc, httpx2.TransportError | ConnectionError | TimeoutError)


def _describe(exc: BaseException) -> str:
    if isinstance(exc, ApiError):
        return f"HTTP {exc.status.code}: {exc.status.message}"
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__

