"""What a filter body may change in neuron-scheduler-extender: reservations only for pods the API server shows
unbound and naming this scheduler, only on nodes whose usage annotation placed them, and never more than the caps.

The scenario is the one an outside tester reported: an unauthenticated POST /filter naming a pod that does not
exist (uid ``u-evil``, ``aws.amazon.com/neuron: 16``) and a node; afterwards a real pod asking for one torus row
(4 devices; trn2.48xlarge has 16 in a 4x4 torus) must still get the node.
"""

from __future__ import annotations

import asyncio
import json
import re
from typing import Any

import pytest
from lightkube import ApiError
from lightkube.models.meta_v1 import Status
from prometheus_client import CollectorRegistry

from neuron_dra.extender.decide import Decider
from neuron_dra.extender.pending import PendingPods
from neuron_dra.extender.podspec import pod_info
from neuron_dra.extender.reservations import ReservationBook
from neuron_dra.extender.service import ExtenderService
from neuron_dra.usage_annotation import USAGE_ANNOTATION, DeviceUsage

NEURON = "aws.amazon.com/neuron"
FREE = DeviceUsage("torus4x4", 16, 4).to_json()  # a trn2.48xlarge with nothing in use


def pod(name: str, uid: str, neuron: int, *, scheduler: str = "my-scheduler", node: str = "") -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": "ns", "uid": uid, "creationTimestamp": "2026-01-01T00:00:00Z"},
            "spec": {"schedulerName": scheduler, "nodeName": node,
                     "containers": [{"name": "c", "resources": {"limits": {NEURON: str(neuron)}}}]},
            "status": {"phase": "Pending"}}


def body(p: dict[str, Any], nodes: dict[str, str | None]) -> bytes:
    items = [{"metadata": {"name": n, **({"annotations": {USAGE_ANNOTATION: v}} if v is not None else {})}}
             for n, v in nodes.items()]
    return json.dumps({"Pod": p, "Nodes": {"items": items}}).encode()


class _Obj:
    def __init__(self, raw: dict[str, Any]) -> None:
        self.raw = raw

    def to_dict(self) -> dict[str, Any]:
        return self.raw


class FakeApi:
    """The API server's pods by namespace/name; counts GETs."""

    def __init__(self, *pods: dict[str, Any]) -> None:
        self.pods = {f"{p['metadata']['namespace']}/{p['metadata']['name']}": p for p in pods}
        self.gets = 0

    async def get(self, _kind: Any, name: str, *, namespace: str) -> _Obj:
        self.gets += 1
        raw = self.pods.get(f"{namespace}/{name}")
        if raw is None:
            raise ApiError(status=Status(code=404, message=f'pods "{name}" not found'))
        return _Obj(raw)


def service(api: FakeApi | None) -> tuple[ExtenderService, CollectorRegistry]:
    registry = CollectorRegistry()
    pending = PendingPods(api, "my-scheduler")  # type: ignore[arg-type]
    return ExtenderService(Decider(), registry, None, pending=pending), registry


def filter_passes(svc: ExtenderService, raw: bytes) -> list[str]:
    status, answer, _ = asyncio.run(svc.handle("POST", "/filter", {}, raw))
    assert status == 200, answer
    return [n["metadata"]["name"] for n in json.loads(answer)["nodes"]["items"]]


def metric(registry: CollectorRegistry, name: str, **labels: str) -> float:
    for m in registry.collect():
        for s in m.samples:
            if s.name == name and s.labels == labels:
                return float(s.value)
    return 0.0


@pytest.mark.parametrize("named_with", [FREE, None], ids=["with-annotation", "without-annotation"])
def test_a_forged_filter_for_a_pod_that_does_not_exist_reserves_nothing(named_with: str | None) -> None:
    svc, registry = service(FakeApi())
    assert filter_passes(svc, body(pod("evil", "u-evil", 16), {"trn2-a": named_with})) == ["trn2-a"]
    assert len(svc.decider.reservations) == 0
    # With an annotation the claim is checked (and refused); without one there is nothing to reserve on.
    checked = 1 if named_with is not None else 0
    assert metric(registry, "neuron_scheduler_extender_unverified_filters_total", reason="unknown_pod") == checked
    assert filter_passes(svc, body(pod("real", "u-real", 4), {"trn2-a": FREE})) == ["trn2-a"]


@pytest.mark.parametrize("api_pod, reason", [
    (pod("evil", "u-other", 16), "unknown_pod"),  # the name exists, the UID is not its UID
    (pod("evil", "u-evil", 16, scheduler="default-scheduler"), "other_scheduler"),
    (pod("evil", "u-evil", 16, node="trn2-b"), "bound"),
])
def test_a_filter_reserves_only_for_an_unbound_pod_of_this_scheduler(api_pod: dict[str, Any], reason: str) -> None:
    api = FakeApi(api_pod)
    svc, registry = service(api)
    for _ in range(3):
        filter_passes(svc, body(pod("evil", "u-evil", 16), {"trn2-a": FREE}))
    assert len(svc.decider.reservations) == 0
    assert metric(registry, "neuron_scheduler_extender_unverified_filters_total", reason=reason) == 3
    assert api.gets == 1, "a refused claim is remembered: repeating it costs no further GET"


def test_a_real_pending_pod_is_reserved_with_the_requests_the_api_server_has() -> None:
    api = FakeApi(pod("big", "u-big", 16))
    svc, _ = service(api)
    # The body understates the request (1 device); the API server's pod asks for all 16.
    assert filter_passes(svc, body(pod("big", "u-big", 1), {"trn2-a": FREE})) == ["trn2-a"]
    (res,) = svc.decider.live_reservations()
    assert res.pod.uid == "u-big" and res.nodes == {"trn2-a"}
    assert sum(r.count for r in res.pod.requests) == 16
    status, answer, _ = asyncio.run(svc.handle("POST", "/filter", {}, body(pod("next", "u-next", 1),
                                                                         {"trn2-a": FREE})))
    assert json.loads(answer)["failedNodes"] == {"trn2-a": "no free connected set of 1 aws.amazon.com/neuron device"}


def test_the_watch_index_answers_without_a_get() -> None:
    api = FakeApi()  # the GET would say 404: only the index can back the claim
    svc, _ = service(api)
    svc.pending.seen(pod("p", "u-p", 4))
    filter_passes(svc, body(pod("p", "u-p", 4), {"trn2-a": FREE}))
    assert len(svc.decider.reservations) == 1 and api.gets == 0


def test_a_node_named_without_its_annotation_is_never_reserved() -> None:
    api = FakeApi(pod("p", "u-p", 16))
    svc, _ = service(api)
    # A real pending pod: it passes both nodes, but only the node whose usage placed it holds a reservation.
    assert filter_passes(svc, body(pod("p", "u-p", 16), {"trn2-a": None, "trn2-b": FREE})) == ["trn2-a", "trn2-b"]
    (res,) = svc.decider.live_reservations()
    assert res.nodes == {"trn2-b"}
    assert filter_passes(svc, body(pod("q", "u-q", 4), {"trn2-a": FREE})) == ["trn2-a"]


def test_a_pod_without_neuron_requests_is_not_reserved() -> None:
    svc, _ = service(FakeApi(pod("p", "u-p", 0)))
    filter_passes(svc, body(pod("p", "u-p", 0), {"trn2-a": FREE}))
    assert len(svc.decider.reservations) == 0


def test_without_an_api_server_nothing_is_reserved() -> None:
    svc, registry = service(None)
    filter_passes(svc, body(pod("p", "u-p", 4), {"trn2-a": FREE}))
    assert len(svc.decider.reservations) == 0
    assert metric(registry, "neuron_scheduler_extender_unverified_filters_total", reason="no_api") == 1


def test_reservations_are_capped_in_count_oldest_first() -> None:
    book = ReservationBook(15.0, max_pods=3, max_node_entries=1000, clock=lambda: 0.0)
    evicted = [book.add(pod_info(pod(f"p{i}", f"u{i}", 1)), ["a", "b"]) for i in range(5)]
    assert evicted == [0, 0, 0, 1, 1] and book.evicted == 2
    assert [r.pod.uid for r in book.live()] == ["u2", "u3", "u4"]
    assert book.node_entries == 6


def test_reservations_are_capped_in_node_entries() -> None:
    book = ReservationBook(15.0, max_pods=1000, max_node_entries=10, clock=lambda: 0.0)
    book.add(pod_info(pod("p0", "u0", 1)), [f"n{i}" for i in range(6)])
    book.add(pod_info(pod("p1", "u1", 1)), [f"n{i}" for i in range(6)])  # 12 entries > 10: p0 goes
    assert [r.pod.uid for r in book.live()] == ["u1"] and book.node_entries == 6 and book.evicted == 1
    book.add(pod_info(pod("p1", "u1", 1)), ["n0"])  # a new filter for the same pod replaces its reservation
    assert book.node_entries == 1 and len(book) == 1


def test_expired_reservations_free_their_share_of_the_caps() -> None:
    now = [0.0]
    book = ReservationBook(5.0, max_pods=2, max_node_entries=100, clock=lambda: now[0])
    book.add(pod_info(pod("p0", "u0", 1)), ["a"])
    book.add(pod_info(pod("p1", "u1", 1)), ["a"])
    now[0] = 6.0
    assert book.add(pod_info(pod("p2", "u2", 1)), ["a"]) == 0  # the two expired ones went, nothing was evicted
    assert [r.pod.uid for r in book.live()] == ["u2"] and book.node_entries == 1


def test_the_cap_is_a_metric_and_one_warning(caplog: pytest.LogCaptureFixture) -> None:
    registry = CollectorRegistry()
    pods = [pod(f"p{i}", f"u{i}", 1) for i in range(5)]
    svc = ExtenderService(Decider(max_reservations=2), registry, None,
                          pending=PendingPods(FakeApi(*pods), "my-scheduler"))  # type: ignore[arg-type]
    with caplog.at_level("WARNING"):
        for p in pods:
            filter_passes(svc, body(p, {"trn2-a": FREE}))
    assert len(svc.decider.reservations) == 2
    assert metric(registry, "neuron_scheduler_extender_reservations_evicted_total") == 3
    warnings = [r for r in caplog.records if re.search("reservation cap reached", r.getMessage())]
    assert len(warnings) == 1
