"""neuron-scheduler-extender decisions, with expected values from AWS's topology descriptions: trn1.32xlarge and
trn2.48xlarge have 16 devices in a 4x4 torus (device i at row i/4); a connected set of 4 devices is one row
(0-3, 4-7, 8-11, 12-15), of 8 two rows (0-7, 8-15); trn1 has 2 logical cores per device, trn2 4 at LNC 2."""

from __future__ import annotations

import json
from typing import Any

import pytest

from neuron_dra.extender.decide import Decider, explain
from neuron_dra.extender.podspec import BadInput, pod_info
from neuron_dra.usage_annotation import USAGE_ANNOTATION, DeviceUsage, UsageFormatError, parse_usage

NEURON = "aws.amazon.com/neuron"
NEURONCORE = "aws.amazon.com/neuroncore"
ROWS = [set(range(r * 4, r * 4 + 4)) for r in range(4)]


def usage(neuron: set[int] = frozenset(), cores: set[int] = frozenset(), per: int = 4,  # type: ignore[assignment]
          pods: dict[str, dict[str, tuple[int, ...]]] | None = None) -> str:
    return DeviceUsage("torus4x4", 16, per, frozenset(neuron), frozenset(cores), pods=pods or {}).to_json()


def pod(name: str, limits: dict[str, str], *, uid: str | None = None, node: str = "",
        created: str = "2026-01-01T00:00:00Z") -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": "ns", "uid": uid or f"uid-{name}", "creationTimestamp": created},
            "spec": {"nodeName": node, "containers": [{"name": "c", "resources": {"limits": limits}}]},
            "status": {"phase": "Running" if node else "Pending"}}


def args(p: dict[str, Any], nodes: dict[str, str | None]) -> dict[str, Any]:
    items = [{"metadata": {"name": n, **({"annotations": {USAGE_ANNOTATION: v}} if v is not None else {})}}
             for n, v in nodes.items()]
    return {"Pod": p, "Nodes": {"items": items}}


def passed(answer: dict[str, Any]) -> list[str]:
    return [n["metadata"]["name"] for n in answer["nodes"]["items"]]


def test_four_devices_need_a_free_torus_row() -> None:
    d = Decider()
    one_per_row = usage({0, 5, 10, 15})  # 12 free devices, no free row
    row_free = usage({0, 5, 10})  # row 3 (12-15) is free
    _, answer, verdicts = d.filter(args(pod("p", {NEURON: "4"}), {"a": one_per_row, "b": row_free}), [])
    assert passed(answer) == ["b"]
    assert answer["failedNodes"] == {"a": "no free connected set of 4 aws.amazon.com/neuron devices"}
    ((_, ids),) = next(v for v in verdicts if v.node == "b").placement.ids  # type: ignore[union-attr]
    assert set(ids) in ROWS


def test_eight_devices_are_two_rows_of_one_half() -> None:
    d = Decider()
    _, answer, verdicts = d.filter(args(pod("p", {NEURON: "8"}), {"a": usage({3, 12}), "b": usage({1})}), [])
    assert passed(answer) == ["b"]
    ((_, ids),) = verdicts[1].placement.ids  # type: ignore[union-attr]
    assert set(ids) == set(range(8, 16))


def test_cores_of_devices_in_use_whole_are_not_free() -> None:
    # trn1 (2 cores per device): all devices held through aws.amazon.com/neuron but 6 and 7
    busy = set(range(16)) - {6, 7}
    d = Decider()
    _, answer, verdicts = d.filter(args(pod("p", {NEURONCORE: "4"}), {"a": usage(busy, per=2)}), [])
    assert passed(answer) == ["a"]
    ((_, ids),) = verdicts[0].placement.ids  # type: ignore[union-attr]
    assert {c // 2 for c in ids} == {6, 7}
    _, answer, _ = d.filter(args(pod("q", {NEURONCORE: "6"}), {"a": usage(busy, per=2)}), [])
    assert passed(answer) == []


def test_devices_with_cores_in_use_are_not_free_for_whole_devices() -> None:
    # one core on device 0, 5, 10 and 15 (trn2, 4 per device): no row is free for aws.amazon.com/neuron
    d = Decider()
    _, answer, _ = d.filter(args(pod("p", {NEURON: "4"}), {"a": usage(cores={0, 21, 42, 63})}), [])
    assert passed(answer) == [] and "connected set of 4" in answer["failedNodes"]["a"]


def test_back_to_back_pods_do_not_get_the_same_row() -> None:
    d = Decider()
    node = {"a": usage({0, 5, 10})}  # only row 3 is free
    first, answer, _ = d.filter(args(pod("first", {NEURON: "4"}), node), d.live_reservations())
    assert passed(answer) == ["a"]
    d.reserve(first, passed(answer))
    _, answer, _ = d.filter(args(pod("second", {NEURON: "4"}), node), d.live_reservations())
    assert passed(answer) == []
    # The first pod is bound and the node has not reported it: still counted.
    d.pod_seen(pod_info(pod("first", {NEURON: "4"}, node="a")))
    assert len(d.reservations) == 0
    _, answer, _ = d.filter(args(pod("second", {NEURON: "4"}), node), d.live_reservations())
    assert passed(answer) == []
    # Once the node reports it, it is not counted twice: the annotation alone decides.
    reported = usage({0, 5, 10, 12, 13, 14, 15}, pods={"ns/first": {"neuron": (12, 13, 14, 15)}})
    _, answer, _ = d.filter(args(pod("small", {NEURON: "2"}), {"a": reported}), [])
    assert passed(answer) == ["a"]


def test_reservations_expire() -> None:
    now = [0.0]
    d = Decider(reserve_for=5.0, clock=lambda: now[0])
    p = pod_info(pod("first", {NEURON: "4"}))
    d.reserve(p, ["a"])
    assert len(d.live_reservations()) == 1
    now[0] = 6.0
    assert d.live_reservations() == []


def test_nodes_without_usage_pass_last() -> None:
    d = Decider()
    a = args(pod("p", {NEURON: "1"}), {"fresh": usage(), "unknown": None, "broken": "{not json"})
    _, answer, _ = d.filter(a, [])
    assert passed(answer) == ["fresh", "unknown", "broken"]
    scores, _ = d.prioritize(a, [])
    by_node = {s["host"]: s["score"] for s in scores}
    assert by_node["unknown"] == 0 and by_node["broken"] == 0 and by_node["fresh"] > 0


def with_allocatable(request: dict[str, Any], node: str, allocatable: dict[str, str] | None) -> dict[str, Any]:
    """``request`` with ``status.allocatable`` on ``node`` (as the scheduler sends whole Nodes)."""
    for item in request["Nodes"]["items"]:
        if item["metadata"]["name"] == node:
            item["status"] = {} if allocatable is None else {"allocatable": allocatable}
    return request


def test_a_node_no_device_plugin_serves_passes_whatever_its_last_annotation_says() -> None:
    """A node moved to the DRA driver keeps its device plugin's last annotation (all 16 devices in use here), but
    its allocatable offers neither resource: the extender has nothing to place there and leaves the node to the
    scheduler's own checks (DRA's extended-resource allocation), with the lowest score and no reservation."""
    d = Decider()
    full = usage(set(range(16)))
    request = args(pod("p", {NEURON: "4"}), {"dra": full, "plugin": full, "unknown": full})
    with_allocatable(request, "dra", {"cpu": "8", NEURON: "0", NEURONCORE: "0"})
    with_allocatable(request, "plugin", {"cpu": "8", NEURON: "16", NEURONCORE: "64"})
    with_allocatable(request, "unknown", None)  # no allocatable listed: judged by the annotation, as before
    _, answer, verdicts = d.filter(request, [])
    assert passed(answer) == ["dra"]
    assert set(answer["failedNodes"]) == {"plugin", "unknown"}
    [dra] = [v for v in verdicts if v.node == "dra"]
    assert dra.placement is None and "device plugin" in dra.detail
    scores, _ = d.prioritize(request, [])
    assert {s["host"]: s["score"] for s in scores}["dra"] == 0


@pytest.mark.parametrize("allocatable", [{NEURON: "16"}, {NEURONCORE: "64"}, {NEURON: "0", NEURONCORE: "2"},
                                         {NEURON: "1k"}, {NEURON: ["16"]}, {NEURON: False, NEURONCORE: False}])
def test_a_node_offering_either_resource_is_judged_by_its_annotation(allocatable: dict[str, Any]) -> None:
    d = Decider()
    request = with_allocatable(args(pod("p", {NEURON: "4"}), {"a": usage(set(range(16)))}), "a", allocatable)
    _, answer, _ = d.filter(request, [])
    assert passed(answer) == [], allocatable


def test_prioritize_prefers_the_node_a_placement_fragments_least() -> None:
    d = Decider()
    # A one-device pod on an empty node breaks a free row; on a node whose row 0 is already broken it breaks nothing.
    scores, _ = d.prioritize(args(pod("p", {NEURON: "1"}), {"empty": usage(), "broken": usage({0})}), [])
    by_node = {s["host"]: s["score"] for s in scores}
    assert by_node["broken"] == 10 and by_node["empty"] < by_node["broken"]


def test_explain_names_the_missing_set() -> None:
    d = Decider()
    p = pod_info(pod("p", {NEURON: "4"}))
    text = explain(p, "a", d.verdict(p, "a", usage({0, 5, 10, 15})))
    assert "does not fit" in text and "no free connected set of 4 aws.amazon.com/neuron devices" in text
    assert "[1, 2, 3, 4, 6, 7, 8, 9, 11, 12, 13, 14]" in text


@pytest.mark.parametrize(("limit", "count"), [("4", 4), ("4000m", 4), ("1k", 1000), ("16e0", 16), (8, 8)])
def test_requests_are_kubernetes_quantities(limit: Any, count: int) -> None:
    # the API server keeps a quantity's format (1k stays 1k); extended resources only have to be whole numbers
    assert [r.count for r in pod_info(pod("p", {NEURON: limit})).requests] == [count]


@pytest.mark.parametrize("limit", ["4.5", "1Ki1", " 4", "\u0664", "1e4", pytest.param("9" * 5000, id="5000-digits"),
                                   pytest.param(10**5000, id="5000-digit-int")])
def test_requests_that_are_not_whole_counts_are_refused(limit: Any) -> None:
    with pytest.raises(BadInput, match=f"container c {NEURON} must be a whole number of at most 4096"):
        pod_info(pod("p", {NEURON: limit}))


@pytest.mark.parametrize("body, message", [
    ([], "JSON object"),
    ({"Pod": "x", "Nodes": {"items": []}}, "pod must be a JSON object"),
    ({"Pod": {"metadata": {}}, "Nodes": {"items": []}}, "pod.metadata.name"),
    ({"Pod": pod("p", {NEURON: "four"}), "Nodes": {"items": []}}, "whole number"),
    ({"Pod": pod("p", {NEURON: "-1"}), "Nodes": {"items": []}}, "whole number"),
    ({"Pod": pod("p", {NEURON: True}), "Nodes": {"items": []}}, "whole number"),
    ({"Pod": pod("p", {NEURON: "99999999"}), "Nodes": {"items": []}}, "at most"),
    ({"Pod": pod("p", {NEURON: "1"})}, "nodeCacheCapable: false"),
    ({"Pod": pod("p", {NEURON: "1"}), "Nodes": {"items": "x"}}, "items"),
    ({"Pod": pod("p", {NEURON: "1"}), "Nodes": {"items": [{"metadata": {}}]}}, "metadata.name"),
    ({"Pod": {"metadata": {"name": "p"}, "spec": {"containers": "x"}}, "Nodes": {"items": []}}, "containers"),
])
def test_hostile_bodies_are_refused_with_a_reason(body: Any, message: str) -> None:
    with pytest.raises(BadInput, match=message):
        Decider().filter(json.loads(json.dumps(body)), [])


@pytest.mark.parametrize("text, message", [
    ("[]", "JSON object"),
    ('{"v": 2}', "schema version"),
    ('{"v": 1, "topology": "mesh"}', "topology"),
    ('{"v": 1, "topology": "torus4x4", "devices": 16, "coresPerDevice": 4, "neuron": [16]}', "0..15"),
    ('{"v": 1, "topology": "torus4x4", "devices": 99999, "coresPerDevice": 4}', "devices"),
    ('{"v": 1, "topology": "ring", "devices": 12, "coresPerDevice": 2, "pods": {"a/b": {"neuron": "x"}}}', "pods"),
])
def test_bad_usage_annotations_are_named(text: str, message: str) -> None:
    with pytest.raises(UsageFormatError, match=message):
        parse_usage(text, "node n")


def test_usage_annotation_round_trip() -> None:
    doc = DeviceUsage("ring", 12, 2, frozenset({1}), frozenset({4, 5}), frozenset({7}),
                      {"ns/p": {"neuron": (1,), "neuroncore": ()}}, "inf2.48xlarge", 1, 3, 12.5)
    assert parse_usage(doc.to_json()) == doc
