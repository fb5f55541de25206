"""Node selection as the Kubernetes API reference defines it (NodeSelector, NodeSelectorTerm,
NodeSelectorRequirement): the DRA driver asks it at shutdown whether its DaemonSet still means this node."""

from __future__ import annotations

from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from accel_core.nodeaffinity import requirement_matches, selects_node


def required(*terms: list[dict[str, Any]]) -> dict[str, Any]:
    return {"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": [{"matchExpressions": t} for t in terms]}}}}


MIGRATED = {"kubernetes.io/os": "linux", "node.kubernetes.io/instance-type": "trn2.48xlarge",
            "neuron.aws.com/driver": "dra"}
NOT_MIGRATED = {k: v for k, v in MIGRATED.items() if k != "neuron.aws.com/driver"}
DRA_SIDE = [{"key": "node.kubernetes.io/instance-type", "operator": "In", "values": ["trn2.48xlarge"]},
            {"key": "neuron.aws.com/driver", "operator": "In", "values": ["dra"]}]
PLUGIN_SIDE = [{"key": "node.kubernetes.io/instance-type", "operator": "In", "values": ["trn2.48xlarge"]},
               {"key": "neuron.aws.com/driver", "operator": "NotIn", "values": ["dra"]}]


def test_the_migration_label_splits_the_two_daemonsets() -> None:
    assert selects_node(required(DRA_SIDE), MIGRATED) and not selects_node(required(PLUGIN_SIDE), MIGRATED)
    assert selects_node(required(PLUGIN_SIDE), NOT_MIGRATED) and not selects_node(required(DRA_SIDE), NOT_MIGRATED)


def test_terms_are_ored_requirements_anded_and_nodeselector_anded() -> None:
    other = [{"key": "kubernetes.io/os", "operator": "In", "values": ["windows"]}]
    assert selects_node(required(other, DRA_SIDE), MIGRATED)
    assert not selects_node({**required(DRA_SIDE), "nodeSelector": {"kubernetes.io/os": "windows"}}, MIGRATED)
    assert selects_node({"nodeSelector": {"kubernetes.io/os": "linux"}}, MIGRATED)
    assert selects_node({}, {})  # no selection: every node


def test_empty_terms_match_no_node() -> None:
    assert not selects_node(required(), MIGRATED)
    assert not selects_node(required([]), MIGRATED)


def test_match_fields_name_the_node() -> None:
    spec = {"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
        {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["t1"]}]}]}}}}
    assert selects_node(spec, {}, "t1") and not selects_node(spec, {}, "t2")


def test_gt_lt_compare_integers_only() -> None:
    gt = {"key": "n", "operator": "Gt", "values": ["3"]}
    assert requirement_matches(gt, {"n": "4"}) and not requirement_matches(gt, {"n": "3"})
    assert not requirement_matches(gt, {"n": "٤"})  # an Arabic-Indic four is no integer label
    assert not requirement_matches(gt, {}) and not requirement_matches({**gt, "values": ["x"]}, {"n": "4"})
    assert requirement_matches({"key": "n", "operator": "Lt", "values": ["-1"]}, {"n": "-2"})


label_values = st.text(alphabet="abc.-_1", min_size=0, max_size=4)


@given(st.dictionaries(st.sampled_from(["a", "b", "c"]), label_values), st.sampled_from(["a", "b", "c"]),
       st.lists(label_values, max_size=3))
def test_not_in_is_the_complement_of_in_and_exists_of_does_not_exist(labels: dict[str, str], key: str,
                                                                      values: list[str]) -> None:
    def match(op: str) -> bool:
        return requirement_matches({"key": key, "operator": op, "values": values}, labels)

    assert match("In") != match("NotIn")
    assert match("Exists") != match("DoesNotExist")
    assert not match("Bogus")
