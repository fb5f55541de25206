"""Every CDI spec the writer produces is valid by the CDI schema (tests/cdi_schema.py); the schema rejects what the
CDI facts forbid, so the check is not vacuous."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from cdi_schema import assert_valid_cdi_spec
from hypothesis import given, settings
from hypothesis import strategies as st

from accel_core.dra.cdi import CdiSpecWriter
from accel_core.edits import ContainerEdits, DeviceNode, Mount

_names = st.from_regex(r"[A-Za-z0-9][A-Za-z0-9_.:-]{0,20}", fullmatch=True)
_paths = st.from_regex(r"/[a-z0-9/_.-]{1,30}", fullmatch=True)
_nodes = st.builds(DeviceNode, _paths, st.none() | _paths, st.sampled_from(["r", "rw", "rwm"]),
                   st.none() | st.integers(0, 511), st.none() | st.integers(0, 2**20))
_mounts = st.builds(Mount, _paths, _paths, st.booleans())
_env = st.tuples(st.from_regex(r"[A-Z_][A-Z0-9_]{0,15}", fullmatch=True), st.text(max_size=20))
_edits = st.builds(ContainerEdits, device_nodes=st.lists(_nodes, max_size=3).map(tuple),
                   env=st.lists(_env, max_size=3).map(tuple), mounts=st.lists(_mounts, max_size=2).map(tuple))


@settings(max_examples=30, deadline=None)
@given(devices=st.lists(st.tuples(_names, _edits), min_size=1, max_size=4, unique_by=lambda d: d[0]), common=_edits)
def test_written_specs_are_valid(tmp_path_factory: pytest.TempPathFactory, devices: list[tuple[str, ContainerEdits]],
                                 common: ContainerEdits) -> None:
    root = tmp_path_factory.mktemp("cdi")
    writer = CdiSpecWriter(root, "k8s.example.com", "claim")
    writer.write("0a1b-uid", devices, common=common)
    assert_valid_cdi_spec(json.loads(writer.spec_path("0a1b-uid").read_text()))


GOOD: dict[str, Any] = {"cdiVersion": "0.5.0", "kind": "k8s.example.com/claim", "devices": [
    {"name": "0a-dev", "containerEdits": {"deviceNodes": [{"path": "/dev/x", "hostPath": "/dev/x", "type": "c"}]}}]}


def _with(path: list[Any], value: Any) -> dict[str, Any]:
    spec = copy.deepcopy(GOOD)
    target: Any = spec
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value
    return spec


def test_the_schema_accepts_a_known_good_spec() -> None:
    assert_valid_cdi_spec(GOOD)


@pytest.mark.parametrize("spec", [
    _with(["devices"], []),  # at least one device
    _with(["kind"], "k8s.example.com"),  # no class
    _with(["kind"], "-bad.com/claim"),
    _with(["cdiVersion"], "0.5"),
    _with(["colour"], "blue"),  # unknown field
    _with(["devices", 0, "name"], "bad name"),
    _with(["devices", 0, "containerEdits", "env"], ["NOVALUE"]),
    _with(["devices", 0, "containerEdits", "deviceNodes", 0, "path"], "dev/x"),
    _with(["devices", 0, "containerEdits", "deviceNodes", 0, "permissions"], "rx"),
    _with(["devices", 0, "containerEdits", "hooks"], [{"hookName": "prestart", "path": "/bin/true"}]),
])
def test_the_schema_rejects_what_cdi_forbids(spec: dict[str, Any]) -> None:
    with pytest.raises(jsonschema.ValidationError):
        assert_valid_cdi_spec(spec)


@pytest.mark.parametrize("spec", [
    _with(["cdiVersion"], "0.4.0"),  # hostPath and a digit-first name need 0.5.0
    _with(["annotations"], {"a": "b"}),  # annotations need 0.6.0
])
def test_features_need_their_version(spec: dict[str, Any]) -> None:
    with pytest.raises(AssertionError, match="too old"):
        assert_valid_cdi_spec(spec)


def test_driver_specs_on_disk_are_valid(tmp_path: Path) -> None:
    """The writer's own output for the edits the Neuron and EFA drivers use (device nodes, env, read-only mounts)."""
    writer = CdiSpecWriter(tmp_path, "k8s.neuron.aws.com", "claim")
    edits = ContainerEdits(device_nodes=(DeviceNode("/dev/neuron0", major=239, minor=0),),
                           env=(("NEURON_RT_VISIBLE_CORES", "0-3"),),
                           mounts=(Mount("/opt/aws/neuron", "/opt/aws/neuron"),))
    writer.write("u-1", [("u-1-neuron-device-0", edits)], common=ContainerEdits(env=(("NODE", "n"),)))
    assert_valid_cdi_spec(json.loads(writer.spec_path("u-1").read_text()))
