"""The extender process: HTTP verbs (``/filter``, ``/prioritize``, ``/explain``, ``/healthz``), the pod watches
that feed the bound-pod index and the index of this scheduler's unbound pods, and Prometheus metrics.

Decisions run in a worker thread (parsing a thousand Node objects takes a while) on a snapshot of the
reservations; the pod index is copy-on-write (see decide.py), so the event loop keeps serving and watching.

A filter body is a claim, not a fact: it reserves only for a pod the API server shows unbound and naming this
scheduler (pending.py), only on nodes whose usage annotation placed it, and reservations are capped
(reservations.py). Who may call at all is the transport's job (mutual TLS, tls.py).
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Callable
from typing import Any

from lightkube import AsyncClient
from lightkube.operators import not_equal
from lightkube.resources.core_v1 import Pod
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from accel_core.backoff import Backoff, wait_or_stop
from accel_core.logs import kv
from neuron_dra.extender.decide import Decider, Verdict, explain
from neuron_dra.extender.httpserver import JSON, TEXT, HttpServer, Response
from neuron_dra.extender.pending import PendingPods
from neuron_dra.extender.podspec import BadInput, PodInfo, pod_info
from neuron_dra.extender.tls import FollowedTls

log = logging.getLogger(__name__)

#: at most one warning of a kind per this many seconds while reservations are evicted or refused for the caps
EVICTION_LOG_EVERY = 60.0
BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)


class ExtenderMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.requests = Counter("neuron_scheduler_extender_requests_total", "Extender calls by verb and result",
                                ["verb", "result"], registry=registry)
        self.latency = Histogram("neuron_scheduler_extender_request_seconds", "Time to answer a verb", ["verb"],
                                 buckets=BUCKETS, registry=registry)
        self.nodes = Counter("neuron_scheduler_extender_node_verdicts_total",
                             "Filter verdicts per node: fits, no_connected_set, unpublished (no usable annotation), "
                             "no_device_plugin (its allocatable offers neither resource: DRA-served, or the plugin "
                             "is away)",
                             ["verdict"], registry=registry)
        self.bound = Gauge("neuron_scheduler_extender_bound_pods",
                           "Bound pods with Neuron requests the pod watch knows", registry=registry)
        self.reserved = Gauge("neuron_scheduler_extender_reservations",
                              "Pods passed to nodes and not bound yet", registry=registry)
        self.watch_restarts = Counter("neuron_scheduler_extender_pod_watch_restarts_total",
                                      "Pod watch restarts after an error", registry=registry)
        self.pending = Gauge("neuron_scheduler_extender_pending_pods",
                             "Unbound pods naming this scheduler (the pods a filter may reserve for)",
                             registry=registry)
        self.evicted = Counter("neuron_scheduler_extender_reservations_evicted_total",
                               "Reservations a namespace dropped of its own to stay within its share of the caps",
                               registry=registry)
        self.refused = Counter("neuron_scheduler_extender_reservations_refused_total",
                               "Passing filters that reserved nothing because the reservation book was full "
                               "(other namespaces' reservations are never dropped for them)", registry=registry)
        self.unreserved = Counter("neuron_scheduler_extender_unverified_filters_total",
                                  "Passing filters that reserved nothing because the API server does not show the "
                                  "pod unbound and naming this scheduler, by reason", ["reason"], registry=registry)


class ExtenderService:
    def __init__(self, decider: Decider, registry: CollectorRegistry, client: AsyncClient | None = None, *,
                 scheduler_name: str = "my-scheduler", pending: PendingPods | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.decider = decider
        self.client = client
        self.scheduler_name = scheduler_name
        self.pending = pending if pending is not None else PendingPods(client, scheduler_name)
        self.metrics = ExtenderMetrics(registry)
        self._clock = clock
        self._logged: dict[str, float] = {}

    # -- HTTP --------------------------------------------------------------------------------------------------------
    async def handle(self, method: str, path: str, query: dict[str, list[str]], body: bytes) -> Response:
        if path == "/healthz" and method in ("GET", "HEAD"):
            return 200, b"ok\n", TEXT
        if path in ("/filter", "/prioritize", "/explain"):
            if method != "POST":
                return 405, f"{path} takes POST with an ExtenderArgs JSON body\n".encode(), TEXT
            return await self._verb(path[1:], body, query)
        return 404, b"not found: the extender serves POST /filter, /prioritize, /explain and GET /healthz\n", TEXT

    async def _verb(self, verb: str, body: bytes, query: dict[str, list[str]]) -> Response:
        start = time.perf_counter()
        reservations = self.decider.live_reservations()
        self.metrics.reserved.set(len(reservations))
        try:
            result = await asyncio.to_thread(self._decide, verb, body, reservations, query)
        except BadInput as exc:
            self.metrics.requests.labels(verb, "bad_request").inc()
            log.warning("bad extender request", extra=kv(verb=verb, error=str(exc)[:300]))
            return 400, json.dumps({"error": f"bad {verb} request: {exc}"}).encode(), JSON
        if verb == "filter" and result[2]:
            await self._reserve(result[1], result[2])
        self.metrics.requests.labels(verb, "ok").inc()
        self.metrics.latency.labels(verb).observe(time.perf_counter() - start)
        return 200, result[0], JSON if verb != "explain" else TEXT

    async def _reserve(self, claimed: PodInfo, nodes: list[str]) -> None:
        """Reserve for the pod the API server has, if it backs the filter body's claim."""
        pod, reason = await self.pending.verify(claimed)
        if pod is None:
            self.metrics.unreserved.labels(reason).inc()
            log.debug("filter reserves nothing", extra=kv(pod=claimed.key, uid=claimed.uid, reason=reason))
            return
        book = self.decider.reservations
        refused = book.refused
        evicted = self.decider.reserve(pod, nodes)
        self.metrics.reserved.set(len(book))
        if evicted:
            self.metrics.evicted.inc(evicted)
            if self._may_log("evicted"):
                log.warning("reservation cap reached: a namespace at its share dropped its own oldest "
                            "reservations",
                            extra=kv(namespace=pod.key.partition("/")[0], evicted_total=book.evicted,
                                     max_per_namespace=book.max_per_namespace,
                                     max_namespace_entries=book.max_namespace_entries))
        if book.refused > refused:
            self.metrics.refused.inc(book.refused - refused)
            if self._may_log("refused"):
                log.warning("reservation cap reached: the book is full, new reservations are refused "
                            "(the pods pass unreserved)",
                            extra=kv(pod=pod.key, refused_total=book.refused, reservations=len(book),
                                     max_reservations=book.max_pods, namespaces=book.namespaces(),
                                     node_entries=book.node_entries, max_node_entries=book.max_node_entries))

    def _may_log(self, what: str) -> bool:
        """At most one warning of each kind per EVICTION_LOG_EVERY seconds."""
        now = self._clock()
        if now - self._logged.get(what, -EVICTION_LOG_EVERY) < EVICTION_LOG_EVERY:
            return False
        self._logged[what] = now
        return True

    def _decide(self, verb: str, body: bytes, reservations: list[Any],
                query: dict[str, list[str]]) -> tuple[bytes, Any, list[str]]:
        try:
            args = json.loads(body)
        except (ValueError, RecursionError) as exc:
            raise BadInput(f"the body is not JSON ({str(exc)[:200]})") from None
        if verb == "prioritize":
            scores, _ = self.decider.prioritize(args, reservations)
            return json.dumps(scores).encode(), None, []
        if verb == "explain":
            pod, judged = self.decider.decide(args, reservations)
            return "\n".join(explain(pod, v.node, v) for _, v in judged).encode() + b"\n", None, []
        pod, answer, verdicts = self.decider.filter(args, reservations)
        self._count(verdicts)
        passed = [v.node for v in verdicts if v.fits]
        # Only where the node's own usage placed the pod: a node named without a usable annotation passes (restarts
        # never block scheduling) but there is nothing to count a reservation against.
        reservable = [v.node for v in verdicts if v.fits and v.placement is not None]
        log.info("filter", extra=kv(pod=pod.key, passed=",".join(passed) or None,
                                    failed="; ".join(f"{v.node}: {v.reason}" for v in verdicts if not v.fits) or None,
                                    counted=",".join(sorted({a for v in verdicts for a in v.added})) or None))
        return json.dumps(answer).encode(), pod, reservable

    def _count(self, verdicts: list[Verdict]) -> None:
        for v in verdicts:
            self.metrics.nodes.labels("no_device_plugin" if v.away else "unpublished" if v.fits and v.placement is None
                                      else "fits" if v.fits else "no_connected_set").inc()

    # -- pod watches ---------------------------------------------------------------------------------------------------
    async def watch_pods(self, stop: asyncio.Event) -> None:
        """Keep the bound-pod index current; restarts (and rebuilds the index) after any error."""
        if self.client is None:
            log.warning("no API client: pods bound but not yet reported by their node are not counted")
            return
        await self._watch("bound", {"spec.nodeName": not_equal("")}, self.decider.reset_index, self._apply, stop)

    async def watch_pending(self, stop: asyncio.Event) -> None:
        """Keep the index of unbound pods naming this scheduler current (what a filter may reserve for)."""
        if self.client is None:
            log.warning("no API client: filters cannot be checked against the API server, nothing is reserved")
            return
        fields = {"spec.nodeName": "", "spec.schedulerName": self.scheduler_name}
        await self._watch("pending", fields, self.pending.reset, self._apply_pending, stop)

    async def _watch(self, what: str, fields: dict[str, Any], reset: Callable[[], None],
                     apply: Callable[[str, dict[str, Any]], None], stop: asyncio.Event) -> None:
        """List then watch pods matching ``fields``; restarts (and rebuilds the index) after any error."""
        assert self.client is not None
        backoff = Backoff(0.5, 30.0)
        while not stop.is_set():
            try:
                reset()
                listing = self.client.list(Pod, namespace="*", fields=fields)
                count = 0
                async for obj in listing:
                    apply("ADDED", obj.to_dict())
                    count += 1
                log.info("pod index ready", extra=kv(index=what, pods=count))
                async for op, obj in self.client.watch(Pod, namespace="*", fields=fields,
                                                       resource_version=listing.resourceVersion):
                    backoff = Backoff(0.5, 30.0)
                    apply(op, obj.to_dict())
                    if stop.is_set():
                        return
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                self.metrics.watch_restarts.inc()
                delay = backoff.next()
                log.warning("pod watch failed; restarting",
                            extra=kv(index=what, error=repr(exc)[:300], retry_in=round(delay, 2)))
                await wait_or_stop(stop, delay)

    def _apply_pending(self, op: str, raw: dict[str, Any]) -> None:
        if op == "DELETED":
            uid = (raw.get("metadata") or {}).get("uid")
            if isinstance(uid, str):
                self.pending.gone(uid)
        else:
            self.pending.seen(raw)
        self.metrics.pending.set(len(self.pending.pods))

    def _apply(self, op: str, raw: dict[str, Any]) -> None:
        try:
            pod = pod_info(raw)
        except BadInput as exc:
            log.debug("skipping a pod", extra=kv(error=str(exc)))
            return
        if op == "DELETED":
            self.decider.pod_gone(pod.uid)
        else:
            self.decider.pod_seen(pod)
        self.metrics.bound.set(sum(len(p) for p in self.decider.bound.values()))


async def serve(service: ExtenderService, address: str, port: int, stop: asyncio.Event,
                tls: FollowedTls | None = None) -> None:
    ssl_context = tls.context if tls is not None else None
    server = HttpServer(service.handle, address, port, ssl_context=ssl_context)
    bound = await server.start()
    if ssl_context is None:
        log.warning("serving plain HTTP without client authentication: any client that reaches the port can call "
                    "the extender (give --tls-cert-file, --tls-key-file and --tls-client-ca-file)",
                    extra=kv(address=address, port=bound))
    log.info("neuron scheduler extender listening",
             extra=kv(address=address, port=bound, tls="mutual" if ssl_context is not None else "off"))
    watches = [asyncio.create_task(service.watch_pods(stop)), asyncio.create_task(service.watch_pending(stop))]
    if tls is not None:
        watches.append(asyncio.create_task(tls.follow(stop)))
    try:
        await stop.wait()
    finally:
        for watch in watches:
            watch.cancel()
        await asyncio.gather(*watches, return_exceptions=True)
        await server.close()
