"""Every CDI spec the writer produces loads in containerd's own CDI library (``tools/cdicheck``, upstream's
``pkg/cdi``), and every device name the drivers hand the kubelet resolves from it. The cases the library must refuse
come from the CDI facts (../shared/reference/kubelet-apis.md section 5), so the oracle is not vacuous."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
from cdi_oracle import assert_cdi_accepts, check_spec, relative_container_paths, run_oracle
from hypothesis import given, settings
from hypothesis import strategies as st

from accel_core.dra.cdi import CdiError, CdiSpecWriter
from accel_core.edits import ContainerEdits, DeviceNode, Mount

pytestmark = pytest.mark.gotools  # tools/cdicheck, built from Go

# pkg/cdi wants a letter or digit at both ends: see test_a_name_ending_in_punctuation_is_refused_by_the_writer.
_names = st.from_regex(r"[A-Za-z0-9]([A-Za-z0-9_.:-]{0,19}[A-Za-z0-9])?", fullmatch=True)
_paths = st.from_regex(r"/[a-z0-9/_.-]{1,30}", fullmatch=True)
_nodes = st.builds(DeviceNode, _paths, st.none() | _paths, st.sampled_from(["r", "rw", "rwm"]),
                   st.none() | st.integers(0, 511), st.none() | st.integers(0, 2**20))
_mounts = st.builds(Mount, _paths, _paths, st.booleans())
# Any text UTF-8 can hold (beyond the Basic Multilingual Plane too: test_an_env_value_beyond_the_bmp_loads).
_env = st.tuples(st.from_regex(r"[A-Z_][A-Z0-9_]{0,15}", fullmatch=True),
                 st.text(st.characters(codec="utf-8"), max_size=20))
_edits = st.builds(ContainerEdits, device_nodes=st.lists(_nodes, max_size=3).map(tuple),
                   env=st.lists(_env, max_size=3).map(tuple), mounts=st.lists(_mounts, max_size=2).map(tuple))
_device_edits = _edits.filter(lambda e: e != ContainerEdits())  # a device without edits: see the test below

KIND = "k8s.example.com/claim"


@settings(max_examples=30, deadline=None)
@given(devices=st.lists(st.tuples(_names, _device_edits), min_size=1, max_size=4, unique_by=lambda d: d[0]),
       common=_edits)
def test_written_specs_load_and_resolve(tmp_path_factory: pytest.TempPathFactory,
                                        devices: list[tuple[str, ContainerEdits]], common: ContainerEdits) -> None:
    root = tmp_path_factory.mktemp("cdi")
    writer = CdiSpecWriter(root, "k8s.example.com", "claim")
    writer.write("0a1b-uid", devices, common=common)
    report = assert_cdi_accepts(root, [f"{KIND}={name}" for name, _ in devices])
    assert report.devices() == {f"{KIND}={name}" for name, _ in devices}


def test_two_claims_load_together_and_inject_as_the_runtime_would(tmp_path: Path) -> None:
    """Both claims' specs in one directory, as /var/run/cdi holds them; injecting a uverbs device gives the container
    the character device 231:192 (ib_uverbs, efa.md) with the cgroup access the spec asks for."""
    writer = CdiSpecWriter(tmp_path, "k8s.efa.aws.com", "claim")
    uverbs = ContainerEdits(device_nodes=(DeviceNode("/dev/infiniband/uverbs0", major=231, minor=192,
                                                     permissions="rw"),))
    writer.write("u-1", [("u-1-efa-0", uverbs)], common=ContainerEdits(env=(("NODE", "n1"),)))
    writer.write("u-2", [("u-2-efa-1", ContainerEdits(env=(("X", "1"),)))])
    report = assert_cdi_accepts(tmp_path, ["k8s.efa.aws.com/claim=u-1-efa-0"], inject=True)
    assert report.devices() == {"k8s.efa.aws.com/claim=u-1-efa-0", "k8s.efa.aws.com/claim=u-2-efa-1"}
    assert report.injected is not None
    assert report.injected["env"] == ["NODE=n1"]
    assert report.injected["devices"] == [{"path": "/dev/infiniband/uverbs0", "type": "c", "major": 231,
                                           "minor": 192}]
    assert report.injected["deviceCgroup"] == [{"allow": True, "type": "c", "major": 231, "minor": 192,
                                                "access": "rw"}]


def test_the_same_device_name_in_two_specs_is_dropped(tmp_path: Path) -> None:
    """Same name at the same priority is a conflict and the device is dropped (CDI facts): a spec left behind by a
    killed prepare would make the kubelet's ID unresolvable, which a per-file schema cannot see."""
    writer = CdiSpecWriter(tmp_path, "k8s.neuron.aws.com", "claim")
    writer.write("u-1", [("u-1-neuron-device-0", ContainerEdits(env=(("A", "1"),)))])
    (tmp_path / "k8s.neuron.aws.com-claim_u-killed.json").write_bytes(writer.spec_path("u-1").read_bytes())
    report = run_oracle([tmp_path], ["k8s.neuron.aws.com/claim=u-1-neuron-device-0"])
    assert not report.ok
    assert report.unresolved == ["k8s.neuron.aws.com/claim=u-1-neuron-device-0"]
    assert any("conflicting device" in e for errs in report.errors.values() for e in errs)


def test_a_device_without_edits_makes_the_whole_spec_refused(tmp_path: Path) -> None:
    """pkg/cdi refuses a device with empty container edits, and with it every device of that spec: the writer
    refuses to write one (the old JSON schema let it pass)."""
    spec = {"cdiVersion": "0.5.0", "kind": "k8s.efa.aws.com/claim",
            "devices": [{"name": "u-1-efa-0", "containerEdits": {"env": ["A=1"]}},
                        {"name": "u-1-efa-1", "containerEdits": {}}]}
    (tmp_path / "k8s.efa.aws.com-claim_u-1.json").write_text(json.dumps(spec))
    report = run_oracle([tmp_path], ["k8s.efa.aws.com/claim=u-1-efa-0"])
    assert not report.ok and report.unresolved == ["k8s.efa.aws.com/claim=u-1-efa-0"]
    assert "empty device edits" in report.problems()
    writer = CdiSpecWriter(tmp_path / "w", "k8s.efa.aws.com", "claim")
    with pytest.raises(CdiError, match="u-1-efa-1"):
        writer.write("u-1", [("u-1-efa-0", ContainerEdits(env=(("A", "1"),))), ("u-1-efa-1", ContainerEdits())])
    assert not writer.spec_path("u-1").exists()


def test_an_env_value_beyond_the_bmp_loads(tmp_path: Path) -> None:
    writer = CdiSpecWriter(tmp_path, "k8s.efa.aws.com", "claim")
    writer.write("u-1", [("u-1-efa-0", ContainerEdits(env=(("A", "\U00010000"),)))])
    assert_cdi_accepts(tmp_path, ["k8s.efa.aws.com/claim=u-1-efa-0"])


def test_a_name_ending_in_punctuation_is_refused_by_the_writer(tmp_path: Path) -> None:
    writer = CdiSpecWriter(tmp_path, "k8s.efa.aws.com", "claim")
    assert not check_spec({"cdiVersion": "0.5.0", "kind": "k8s.efa.aws.com/claim",
                           "devices": [{"name": "u-1-efa-", "containerEdits": {"env": ["A=1"]}}]}).ok
    with pytest.raises(CdiError):
        writer.write("u-1", [("u-1-efa-", ContainerEdits(env=(("A", "1"),)))])


def test_an_id_the_spec_does_not_hold_is_unresolvable(tmp_path: Path) -> None:
    CdiSpecWriter(tmp_path, "k8s.efa.aws.com", "claim").write("u-1", [("u-1-efa-0", ContainerEdits(env=(("A", "1"),)))])
    report = run_oracle([tmp_path], ["k8s.efa.aws.com/claim=u-1-efa-1"])
    assert not report.ok and report.unresolved == ["k8s.efa.aws.com/claim=u-1-efa-1"]


def test_an_empty_directory_is_not_a_pass(tmp_path: Path) -> None:
    assert not run_oracle([tmp_path]).ok


GOOD: dict[str, Any] = {"cdiVersion": "0.5.0", "kind": KIND, "devices": [
    {"name": "0a-dev", "containerEdits": {"deviceNodes": [{"path": "/dev/x", "hostPath": "/dev/x", "type": "c",
                                                           "major": 1, "minor": 3}]}}]}


def _with(path: list[Any], value: Any) -> dict[str, Any]:
    spec = copy.deepcopy(GOOD)
    target: Any = spec
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value
    return spec


def test_the_oracle_accepts_a_known_good_spec() -> None:
    assert check_spec(GOOD).ok


@pytest.mark.parametrize("spec, why", [
    (_with(["devices"], []), "no devices"),
    (_with(["kind"], "k8s.example.com"), "invalid vendor"),  # no class
    (_with(["kind"], "-bad.com/claim"), "should start with letter"),
    (_with(["cdiVersion"], "0.5"), "invalid version"),
    (_with(["cdiVersion"], "0.4.0"), "at least v0.5.0"),  # hostPath and a digit-first name need 0.5.0
    (_with(["annotations"], {"a": "b"}), "at least v0.6.0"),  # annotations need 0.6.0
    (_with(["colour"], "blue"), "not found in type"),  # unknown field
    (_with(["devices", 0, "name"], "bad name"), "in device name"),
    (_with(["devices"], GOOD["devices"] * 2), "multiple device"),
    (_with(["devices", 0, "containerEdits", "env"], ["NOVALUE"]), "invalid environment variable"),
    (_with(["devices", 0, "containerEdits", "deviceNodes", 0, "permissions"], "rx"), "invalid permissions"),
    (_with(["devices", 0, "containerEdits", "deviceNodes", 0, "type"], "x"), "invalid type"),
    (_with(["devices", 0, "containerEdits", "hooks"], [{"hookName": "bogus", "path": "/bin/true"}]),
     "invalid hook name"),
])
def test_the_oracle_refuses_what_cdi_forbids(spec: dict[str, Any], why: str) -> None:
    report = check_spec(spec)
    assert not report.ok
    assert why in report.problems(), report.problems()


def test_relative_container_paths_pass_the_library_so_the_tests_check_them() -> None:
    """pkg/cdi loads relative device and mount paths: the one check kept from the old JSON schema."""
    spec = _with(["devices", 0, "containerEdits"], {"deviceNodes": [{"path": "dev/x", "type": "c", "major": 1,
                                                                     "minor": 3}],
                                                    "mounts": [{"hostPath": "/a", "containerPath": "a"}]})
    assert check_spec(spec).ok
    assert relative_container_paths(spec) == ["dev/x", "a"]
    assert relative_container_paths(GOOD) == []


def test_driver_specs_on_disk_load(tmp_path: Path) -> None:
    """The writer's own output for the edits the Neuron and EFA drivers use (device nodes, env, read-only mounts)."""
    writer = CdiSpecWriter(tmp_path, "k8s.neuron.aws.com", "claim")
    edits = ContainerEdits(device_nodes=(DeviceNode("/dev/neuron0", major=239, minor=0),),
                           env=(("NEURON_RT_VISIBLE_CORES", "0-3"),),
                           mounts=(Mount("/opt/aws/neuron", "/opt/aws/neuron"),))
    writer.write("u-1", [("u-1-neuron-device-0", edits)], common=ContainerEdits(env=(("NODE", "n"),)))
    report = assert_cdi_accepts(tmp_path, ["k8s.neuron.aws.com/claim=u-1-neuron-device-0"])
    assert [s["cdiVersion"] for s in report.specs] == ["0.5.0"]
    assert json.loads(writer.spec_path("u-1").read_text())["kind"] == "k8s.neuron.aws.com/claim"
