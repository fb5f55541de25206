"""The extender process: HTTP verbs (``/filter``, ``/prioritize``, ``/explain``, ``/healthz``), the pod watch that
feeds the bound-pod index, and Prometheus metrics.

Decisions run in a worker thread (parsing a thousand Node objects takes a while) on a snapshot of the
reservations; the pod index is copy-on-write (see decide.py), so the event loop keeps serving and watching.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from typing import Any

from lightkube import AsyncClient
from lightkube.operators import not_equal
from lightkube.resources.core_v1 import Pod
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from accel_core.backoff import Backoff, wait_or_stop
from accel_core.logs import kv
from neuron_dra.extender.decide import Decider, Verdict, explain
from neuron_dra.extender.httpserver import JSON, TEXT, HttpServer, Response
from neuron_dra.extender.podspec import BadInput, pod_info

log = logging.getLogger(__name__)

BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)


class ExtenderMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.requests = Counter("neuron_scheduler_extender_requests_total", "Extender calls by verb and result",
                                ["verb", "result"], registry=registry)
        self.latency = Histogram("neuron_scheduler_extender_request_seconds", "Time to answer a verb", ["verb"],
                                 buckets=BUCKETS, registry=registry)
        self.nodes = Counter("neuron_scheduler_extender_node_verdicts_total",
                             "Filter verdicts per node: fits, no_connected_set, unpublished (no usable annotation)",
                             ["verdict"], registry=registry)
        self.bound = Gauge("neuron_scheduler_extender_bound_pods",
                           "Bound pods with Neuron requests the pod watch knows", registry=registry)
        self.reserved = Gauge("neuron_scheduler_extender_reservations",
                              "Pods passed to nodes and not bound yet", registry=registry)
        self.watch_restarts = Counter("neuron_scheduler_extender_pod_watch_restarts_total",
                                      "Pod watch restarts after an error", registry=registry)


class ExtenderService:
    def __init__(self, decider: Decider, registry: CollectorRegistry, client: AsyncClient | None = None) -> None:
        self.decider = decider
        self.client = client
        self.metrics = ExtenderMetrics(registry)

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
        try:
            result = await asyncio.to_thread(self._decide, verb, body, reservations, query)
        except BadInput as exc:
            self.metrics.requests.labels(verb, "bad_request").inc()
            log.warning("bad extender request", extra=kv(verb=verb, error=str(exc)[:300]))
            return 400, json.dumps({"error": f"bad {verb} request: {exc}"}).encode(), JSON
        if verb == "filter":
            pod, passed = result[1], result[2]
            self.decider.reserve(pod, passed)
            self.metrics.reserved.set(len(self.decider.reservations))
        self.metrics.requests.labels(verb, "ok").inc()
        self.metrics.latency.labels(verb).observe(time.perf_counter() - start)
        return 200, result[0], JSON if verb != "explain" else TEXT

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
        log.info("filter", extra=kv(pod=pod.key, passed=",".join(passed) or None,
                                    failed="; ".join(f"{v.node}: {v.reason}" for v in verdicts if not v.fits) or None,
                                    counted=",".join(sorted({a for v in verdicts for a in v.added})) or None))
        return json.dumps(answer).encode(), pod, passed

    def _count(self, verdicts: list[Verdict]) -> None:
        for v in verdicts:
            self.metrics.nodes.labels("unpublished" if v.fits and v.placement is None
                                      else "fits" if v.fits else "no_connected_set").inc()

    # -- pod watch -----------------------------------------------------------------------------------------------------
    async def watch_pods(self, stop: asyncio.Event) -> None:
        """Keep the bound-pod index current; restarts (and rebuilds the index) after any error."""
        if self.client is None:
            log.warning("no API client: pods bound but not yet reported by their node are not counted")
            return
        backoff = Backoff(0.5, 30.0)
        while not stop.is_set():
            try:
                self.decider.reset_index()
                listing = self.client.list(Pod, namespace="*", fields={"spec.nodeName": not_equal("")})
                async for obj in listing:
                    self._apply("ADDED", obj.to_dict())
                log.info("pod index ready", extra=kv(bound=sum(len(p) for p in self.decider.bound.values())))
                async for op, obj in self.client.watch(Pod, namespace="*", fields={"spec.nodeName": not_equal("")},
                                                       resource_version=listing.resourceVersion):
                    backoff = Backoff(0.5, 30.0)
                    self._apply(op, obj.to_dict())
                    if stop.is_set():
                        return
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                self.metrics.watch_restarts.inc()
                delay = backoff.next()
                log.warning("pod watch failed; restarting",
                            extra=kv(error=repr(exc)[:300], retry_in=round(delay, 2)))
                await wait_or_stop(stop, delay)

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


async def serve(service: ExtenderService, address: str, port: int, stop: asyncio.Event) -> None:
    server = HttpServer(service.handle, address, port)
    bound = await server.start()
    log.info("neuron scheduler extender listening", extra=kv(address=address, port=bound))
    watch = asyncio.create_task(service.watch_pods(stop))
    try:
        await stop.wait()
    finally:
        watch.cancel()
        await asyncio.gather(watch, return_exceptions=True)
        await server.close()
