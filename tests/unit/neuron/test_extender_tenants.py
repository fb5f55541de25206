"""One tenant cannot push another's reservation out of neuron-scheduler-extender's book.

The scenario an outside tester reported, at small scale: pod A of namespace ``tenant-a`` (``aws.amazon.com/neuron:
4``) passes onto the one node whose only free connected set of 4 devices (one row of trn2.48xlarge's 4x4 torus:
devices 12-15 with 0-11 in use) it is being bound to; then many pending one-core pods of namespace ``tenant-b`` pass
filters within ``reserveFor``. A's reservation must stay, so a 4-device pod of ``tenant-b`` asking next does not get
that node. A namespace over its share drops its own oldest reservations; a full book refuses newcomers.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

from prometheus_client import CollectorRegistry
from test_extender_trust import FakeApi, metric

from neuron_dra.extender.decide import Decider
from neuron_dra.extender.pending import PendingPods
from neuron_dra.extender.service import ExtenderService
from neuron_dra.usage_annotation import USAGE_ANNOTATION, DeviceUsage

NEURON, NEURONCORE = "aws.amazon.com/neuron", "aws.amazon.com/neuroncore"
ONE_ROW_FREE = DeviceUsage("torus4x4", 16, 4, neuron=frozenset(range(12))).to_json()
FREE = DeviceUsage("torus4x4", 16, 4).to_json()
OTHER_NODES = {f"trn2-b{i}": FREE for i in range(3)}


def pod(namespace: str, name: str, resource: str, count: int) -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": namespace, "uid": f"uid-{namespace}-{name}",
                         "creationTimestamp": "2026-01-01T00:00:00Z"},
            "spec": {"schedulerName": "my-scheduler",
                     "containers": [{"name": "c", "resources": {"limits": {resource: str(count)}}}]},
            "status": {"phase": "Pending"}}


def passes(svc: ExtenderService, p: dict[str, Any], nodes: dict[str, str]) -> list[str]:
    items = [{"metadata": {"name": n, "annotations": {USAGE_ANNOTATION: v}}} for n, v in nodes.items()]
    raw = json.dumps({"Pod": p, "Nodes": {"items": items}}).encode()
    status, answer, _ = asyncio.run(svc.handle("POST", "/filter", {}, raw))
    assert status == 200, answer
    return [n["metadata"]["name"] for n in json.loads(answer)["nodes"]["items"]]


def run(crowd: list[dict[str, Any]]) -> tuple[ExtenderService, CollectorRegistry, list[str]]:
    """A passes onto trn2-a, the crowd passes elsewhere, then tenant-b's 4-device pod asks for trn2-a."""
    a = pod("tenant-a", "a", NEURON, 4)
    late = pod("tenant-b", "late", NEURON, 4)
    registry = CollectorRegistry()
    svc = ExtenderService(Decider(max_reservations=16, max_reservations_per_namespace=4), registry, None,
                          pending=PendingPods(FakeApi(a, late, *crowd), "my-scheduler"))  # type: ignore[arg-type]
    assert passes(svc, a, {"trn2-a": ONE_ROW_FREE}) == ["trn2-a"]
    for p in crowd:
        assert passes(svc, p, OTHER_NODES) == list(OTHER_NODES)
    return svc, registry, passes(svc, late, {"trn2-a": ONE_ROW_FREE})


def test_many_pending_pods_of_one_namespace_do_not_evict_another_namespaces_reservation() -> None:
    crowd = [pod("tenant-b", f"b{i}", NEURONCORE, 1) for i in range(64)]
    svc, registry, late = run(crowd)
    assert late == [], "tenant-b's pod got the row pod A is being bound to"
    assert "uid-tenant-a-a" in svc.decider.reservations
    # tenant-b holds its share (4) and made room by dropping its own oldest: 64 - 4
    assert metric(registry, "neuron_scheduler_extender_reservations_evicted_total") == 60
    assert metric(registry, "neuron_scheduler_extender_reservations_refused_total") == 0
    assert len(svc.decider.reservations) == 1 + 4


def test_a_full_book_refuses_newcomers_rather_than_evicting() -> None:
    crowd = [pod(f"tenant-b{n}", f"b{i}", NEURONCORE, 1) for n in range(10) for i in range(4)]  # 10 namespaces x 4
    svc, registry, late = run(crowd)
    assert late == [] and "uid-tenant-a-a" in svc.decider.reservations
    assert len(svc.decider.reservations) == 16
    assert metric(registry, "neuron_scheduler_extender_reservations_refused_total") == 40 - 15
    assert metric(registry, "neuron_scheduler_extender_reservations_evicted_total") == 0


def test_a_namespace_over_its_share_replaces_its_own_oldest() -> None:
    own = [pod("tenant-a", f"a{i}", NEURONCORE, 1) for i in range(6)]
    svc, _, _ = run(own)
    kept = sorted(r.pod.key for r in svc.decider.live_reservations() if r.pod.key.startswith("tenant-a/"))
    assert kept == ["tenant-a/a2", "tenant-a/a3", "tenant-a/a4", "tenant-a/a5"], "A's own newest four"
