"""UltraServer (trn2u) without a cluster: fake hosts, discovery of the class attributes, node labels, the
``neuron-node`` device and its shared counter, ``UltraServerConfig`` and the runtime env, and the listings.

Outside facts used (neuron.md 1.3, 2.5): the class attributes are ``node_id_2``, ``node_id_4``, ``server_id_2``,
``server_id_4`` (``%016llx``) and ``ultraserver_mode`` (comma list of 1=X4, 2=X2H, 3=X2V, 4=X1, or ``busy``); a node
outside an UltraServer reports ``-1``, ``0000000000000000`` and an empty mode; a Trn2 UltraServer is 4 nodes,
allocatable in sets of 1, 2 and 4; the node labels are ``neuron.amazonaws.com/ultraserver-mode`` (e.g. ``1_2_4``),
``-server-id-2``, ``-node-id-2``, ``-server-id-4``, ``-node-id-4``.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
from drarig import configs
from hostcache import copy_host, shared_host

from accel_core.dra.config import OpaqueEntry
from accel_core.dra.publisher import build_slices, spec_key
from accel_core.dra.slicemodel import CounterSet, SliceDevice, SliceValidationError, validate_devices
from accel_core.dra.types import ClaimError
from accel_core.fakehost import FakeHost, FakeHostError, build_host, cli
from accel_core.paths import HostPaths
from neuron_dra.deviceplugin.listing import inventory_report, inventory_table
from neuron_dra.discovery import discover
from neuron_dra.dra import cli as dra_cli
from neuron_dra.dra.config import NeuronConfig
from neuron_dra.dra.profile import NeuronProfile
from neuron_dra.facts.ultraserver import UltraServerIds, fake_ids, node_labels

CLASS = "sys/class/neuron_device"
ATTRS = ("node_id_2", "node_id_4", "server_id_2", "server_id_4", "ultraserver_mode")
LABELS = ("neuron.amazonaws.com/ultraserver-mode", "neuron.amazonaws.com/ultraserver-server-id-2",
          "neuron.amazonaws.com/ultraserver-node-id-2", "neuron.amazonaws.com/ultraserver-server-id-4",
          "neuron.amazonaws.com/ultraserver-node-id-4")


def class_attrs(root: Path) -> dict[str, str]:
    return {a: (root / CLASS / a).read_text() for a in ATTRS}


def us_host(tmp_path: Path, node: int = 2, name: str = "us-1") -> FakeHost:
    """A copy of the node's tree that the test may change."""
    return copy_host(tmp_path / f"{name}-{node}", "trn2u.48xlarge", ultraserver_id=name, ultraserver_node=node)


def us_shared(node: int = 2, name: str = "us-1") -> FakeHost:
    """The node's tree, read-only (built by the fake-host builder once per session)."""
    return shared_host("trn2u.48xlarge", ultraserver_id=name, ultraserver_node=node)


# -- fake hosts ------------------------------------------------------------------------------------------------------
def test_four_nodes_of_one_ultraserver_are_consistent() -> None:
    nodes = [class_attrs(us_shared(k).root) for k in range(4)]
    assert {n["server_id_4"] for n in nodes} == {nodes[0]["server_id_4"]}  # one 4-node set
    assert [n["node_id_4"] for n in nodes] == ["0\n", "1\n", "2\n", "3\n"]
    pairs = [n["server_id_2"] for n in nodes]
    assert pairs[0] == pairs[1] and pairs[2] == pairs[3] and pairs[0] != pairs[2]  # two 2-node sets
    assert [n["node_id_2"] for n in nodes] == ["0\n", "1\n", "0\n", "1\n"]
    for n in nodes:
        for key in ("server_id_2", "server_id_4"):
            assert len(n[key].strip()) == 16 and int(n[key], 16) != 0
        assert sorted(n["ultraserver_mode"].strip().split(",")) == ["1", "2", "3", "4"]
    other = class_attrs(us_shared(0, "us-2").root)
    assert other["server_id_4"] != nodes[0]["server_id_4"]


@pytest.mark.parametrize("instance_type", ["trn2u.48xlarge", "trn2.48xlarge", "trn1.32xlarge", "inf2.48xlarge"])
def test_standalone_nodes_report_no_ultraserver(instance_type: str) -> None:
    host = shared_host(instance_type)
    assert class_attrs(host.root) == {"node_id_2": "-1\n", "node_id_4": "-1\n", "server_id_2": "0000000000000000\n",
                                      "server_id_4": "0000000000000000\n", "ultraserver_mode": "\n"}
    assert discover(HostPaths(host.root)).ultraserver is None


def test_cli_writes_one_node_and_refuses_bad_combinations(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "n"
    assert cli.main(["-t", "trn2u.48xlarge", "--ultraserver", "us-9", "--ultraserver-node", "3", str(out)]) == 0
    assert (out / CLASS / "node_id_4").read_text() == "3\n"
    assert cli.main(["-t", "trn2.48xlarge", "--ultraserver", "us-9", "--ultraserver-node", "0",
                     str(tmp_path / "x")]) == 2
    assert "not an UltraServer node type" in capsys.readouterr().err
    assert cli.main(["-t", "trn2u.48xlarge", "--ultraserver", "us-9", str(tmp_path / "y")]) == 2
    assert "go together" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        cli.main(["-t", "trn2u.48xlarge", "--ultraserver", "us-9", "--ultraserver-node", "4", str(tmp_path / "z")])
    with pytest.raises(FakeHostError, match="not an UltraServer node type"):
        build_host(tmp_path / "w", "trn1.32xlarge", ultraserver_id="a", ultraserver_node=0)


def test_mutation_api_writes_busy_and_standalone_values(tmp_path: Path) -> None:
    host = us_host(tmp_path)
    ids = discover(HostPaths(host.root)).ultraserver
    assert ids is not None
    host.set_ultraserver(dataclasses.replace(ids, busy=True))
    assert (host.root / CLASS / "ultraserver_mode").read_text() == "busy\n"
    host.set_ultraserver(None)
    assert (host.root / CLASS / "node_id_4").read_text() == "-1\n"


# -- discovery -------------------------------------------------------------------------------------------------------
def test_discovery_reads_the_ids() -> None:
    host = us_shared(3)
    files = class_attrs(host.root)
    ids = discover(HostPaths(host.root)).ultraserver
    assert ids == UltraServerIds(server_id_2=files["server_id_2"].strip(), node_id_2=1,
                                 server_id_4=files["server_id_4"].strip(), node_id_4=3, modes=(1, 2, 3, 4))
    assert ids.set_sizes() == (1, 2, 4)


@pytest.mark.parametrize(("attr", "text", "problem"), [
    ("node_id_4", "4\n", "node_id_4: 4 is outside -1..3"),
    ("node_id_2", "２\n", "node_id_2: expected an integer"),
    ("node_id_2", "-2\n", "node_id_2: -2 is outside -1..1"),
    ("server_id_4", "xyz\n", "server_id_4: expected 16 lower-case hex digits"),
    ("server_id_2", "00ff\n", "server_id_2: expected 16 lower-case hex digits"),
    ("ultraserver_mode", "1,7\n", "ultraserver_mode: expected 'busy' or a comma list of modes 1, 2, 3, 4"),
    ("node_id_4", "-1\n", "disagree about UltraServer membership"),
])
def test_bad_class_attributes_are_problems_naming_the_file(tmp_path: Path, attr: str, text: str,
                                                           problem: str) -> None:
    host = us_host(tmp_path)
    host.corrupt(f"{CLASS}/{attr}", text)
    inv = discover(HostPaths(host.root))
    assert inv.ultraserver is None
    assert any(problem in p and p.startswith("/sys/class/neuron_device") for p in inv.problems), inv.problems
    assert len(inv.devices) == 16 and all(d.present for d in inv.devices)  # the chips are fine


def test_a_driver_without_ultraserver_files_is_not_a_problem(tmp_path: Path) -> None:
    host = us_host(tmp_path)
    for attr in ATTRS:
        (host.root / CLASS / attr).unlink()
    inv = discover(HostPaths(host.root))
    assert inv.ultraserver is None and inv.problems == ()


# -- labels ----------------------------------------------------------------------------------------------------------
def test_node_labels() -> None:
    ids = fake_ids("us-1", 2)
    assert node_labels(ids) == {LABELS[0]: "1_2_4", LABELS[1]: ids.server_id_2, LABELS[2]: "0",
                                LABELS[3]: ids.server_id_4, LABELS[4]: "2"}
    assert node_labels(dataclasses.replace(ids, modes=(1,)))[LABELS[0]] == "4"  # X4 only: sets of 4
    assert node_labels(dataclasses.replace(ids, modes=(3, 4)))[LABELS[0]] == "1_2"  # X2V and X1
    assert node_labels(dataclasses.replace(ids, modes=(), busy=True))[LABELS[0]] is None
    assert node_labels(None) == dict.fromkeys(LABELS)  # removed outside an UltraServer


# -- slices ----------------------------------------------------------------------------------------------------------
def test_counters_go_in_their_own_slice() -> None:
    chips = CounterSet("neuron-chips", {"chips": 2})
    devices = [SliceDevice("a", consumes={"neuron-chips": {"chips": 1}}),
               SliceDevice("b", consumes={"neuron-chips": {"chips": 2}})]
    slices = build_slices("neuron.aws.com", "n", devices, counters=[chips])
    specs = [s.to_dict()["spec"] for s in slices]
    assert [sorted(s) for s in specs] == [["driver", "nodeName", "pool", "sharedCounters"],
                                          ["devices", "driver", "nodeName", "pool"]]
    assert {s["pool"]["resourceSliceCount"] for s in specs} == {2}
    assert specs[0]["sharedCounters"] == [{"name": "neuron-chips", "counters": {"chips": {"value": "2"}}}]
    assert specs[1]["devices"][1]["consumesCounters"] == [
        {"counterSet": "neuron-chips", "counters": {"chips": {"value": "2"}}}]
    # a changed counter changes the fingerprint the publisher compares
    other = build_slices("neuron.aws.com", "n", devices, counters=[CounterSet("neuron-chips", {"chips": 3})])
    assert spec_key(other[0].spec) != spec_key(slices[0].spec)


def test_consuming_an_unknown_counter_is_refused() -> None:
    with pytest.raises(SliceValidationError, match="device a: consumes counter set 'x'"):
        validate_devices([SliceDevice("a", consumes={"x": {"c": 1}})], [])
    with pytest.raises(SliceValidationError, match="device a: consumes counters d"):
        validate_devices([SliceDevice("a", consumes={"x": {"d": 1}})], [CounterSet("x", {"c": 1})])


def test_pool_on_an_ultraserver_node(tmp_path: Path) -> None:
    host = us_host(tmp_path, 1)
    scan = NeuronProfile().scan(HostPaths(host.root), "1.0.0")
    chips = [d for d in scan.devices if d.name.startswith("neuron-device-")]
    (node,) = [d for d in scan.devices if d.name == "neuron-node"]
    assert len(chips) == 16 and all(d.consumes == {"neuron-chips": {"chips": 1}} for d in chips)
    assert node.consumes == {"neuron-chips": {"chips": 16}}  # the node's share: every chip
    assert scan.counters == (CounterSet("neuron-chips", {"chips": 16}),)
    assert node.attributes["resourceType"] == "neuron_node"
    assert (node.attributes["nodeId4"], node.attributes["nodeId2"]) == (1, 1)
    assert node.capacity == {}  # no capacity, as on the chips: the counter alone makes them exclude each other
    assert scan.node_labels[LABELS[4]] == "1"
    # a chip gone unhealthy makes the node device unhealthy too
    host.remove_dev_node("/dev/neuron5")
    scan = NeuronProfile().scan(HostPaths(host.root), "1.0.0")
    assert not scan.health["neuron-node"].healthy


def test_pool_on_a_standalone_node_is_unchanged() -> None:
    host = shared_host("trn2u.48xlarge")
    scan = NeuronProfile().scan(HostPaths(host.root), "1.0.0")
    assert len(scan.devices) == 16 and not any(d.consumes for d in scan.devices) and scan.counters == ()
    assert scan.node_labels == dict.fromkeys(LABELS)


# -- UltraServerConfig -----------------------------------------------------------------------------------------------
def us_config(mode: object) -> dict[str, object]:
    return {"apiVersion": "neuron.aws.com/v1", "kind": "UltraServerConfig", "ultraserverMode": mode}


def test_both_config_kinds_apply_to_one_request() -> None:
    entries = [OpaqueEntry("FromClaim", ("node",), "neuron.aws.com", us_config(4)),
               OpaqueEntry("FromClaim", ("node",), "neuron.aws.com",
                           {"apiVersion": "neuron.aws.com/v1", "kind": "NeuronConfig", "logicalNeuronCore": 1})]
    assert configs(NeuronProfile(), entries, ["node"]) == {"node": NeuronConfig(1, 4)}


@pytest.mark.parametrize(("node", "mode", "env"), [
    (2, 4, {"NEURON_RT_ULTRASERVER_MODE": "1", "NEURON_RT_ULTRASERVER_NODE_ID": "2", "NEURON_GLOBAL_TOPOID": "2"}),
    (3, 2, {"NEURON_RT_ULTRASERVER_MODE": "2", "NEURON_RT_ULTRASERVER_NODE_ID": "1", "NEURON_GLOBAL_TOPOID": "1"}),
    (3, 1, {"NEURON_RT_ULTRASERVER_MODE": "4", "NEURON_RT_ULTRASERVER_NODE_ID": "0", "NEURON_GLOBAL_TOPOID": "0"}),
])
def test_prepare_sets_the_runtime_env(node: int, mode: int, env: dict[str, str]) -> None:
    host = us_shared(node)
    files = class_attrs(host.root)
    inv = discover(HostPaths(host.root))
    edits = NeuronProfile().container_edits(inv, "node", ["neuron-node"], NeuronConfig(ultraserver_mode=mode))
    got = dict(edits.request.env)
    server = files["server_id_2" if mode == 2 else "server_id_4"].strip()
    assert got == {"NEURON_RT_VISIBLE_CORES": "0-63", "NEURON_RT_ULTRASERVER_SERVER_ID": server, **env}
    (only,) = edits.devices.values()
    assert [n.path for n in only.device_nodes] == [f"/dev/neuron{i}" for i in range(16)]


@pytest.mark.parametrize(("modes", "busy", "ultraserver", "mode", "devices", "message"), [
    ((1,), False, True, 2, ["neuron-node"], r"ultraserverMode: 2 is not supported by trn2u.48xlarge "
                                            r"\(supported set sizes: 4\)"),
    ((), True, True, 4, ["neuron-node"], "reports ultraserver_mode 'busy'"),
    (None, False, False, 4, ["neuron-node"], "is not part of an UltraServer"),
    ((1, 2, 3, 4), False, True, 4, ["neuron-device-0"], "an UltraServerConfig needs the node's neuron_node device"),
])
def test_prepare_refuses_what_the_node_cannot_do(tmp_path: Path, modes: tuple[int, ...] | None, busy: bool,
                                                 ultraserver: bool, mode: int, devices: list[str],
                                                 message: str) -> None:
    host = us_host(tmp_path)
    if ultraserver:
        host.set_ultraserver(dataclasses.replace(fake_ids("us-1", 2), modes=modes or (), busy=busy))
    else:
        host.set_ultraserver(None)
    inv = discover(HostPaths(host.root))
    with pytest.raises(ClaimError, match=message):
        NeuronProfile().container_edits(inv, "node", devices, NeuronConfig(ultraserver_mode=mode))


def test_node_device_without_config_is_all_chips_without_ultraserver_env() -> None:
    inv = discover(HostPaths(us_shared().root))
    edits = NeuronProfile().container_edits(inv, "node", ["neuron-node"], NeuronConfig())
    assert dict(edits.request.env) == {"NEURON_RT_VISIBLE_CORES": "0-63"}


# -- listings --------------------------------------------------------------------------------------------------------
def test_device_plugin_listing_shows_the_ultraserver() -> None:
    host = us_shared(1)
    files = class_attrs(host.root)
    inv = discover(HostPaths(host.root))
    report = json.loads(json.dumps(inventory_report(inv)))
    assert report["ultraserver"]["server_id_4"] == files["server_id_4"].strip()
    assert report["ultraserver"]["node_id_4"] == 1 and report["ultraserver"]["set_sizes"] == [1, 2, 4]
    assert report["node_labels"][LABELS[0]] == "1_2_4"
    table = inventory_table(inv)
    assert f"ultraserver: server-id-4 {files['server_id_4'].strip()} node-id-4 1" in table
    standalone = discover(HostPaths(shared_host("trn2u.48xlarge").root))
    assert inventory_report(standalone)["ultraserver"] is None
    assert "ultraserver: none" in inventory_table(standalone)


def test_slices_command_prints_the_node_device_and_its_counter(capsys: pytest.CaptureFixture[str]) -> None:
    host = us_shared(3)
    assert dra_cli.main(["slices", "--host-root", str(host.root), "--node-name", "n1"]) == 0
    slices = json.loads(capsys.readouterr().out)
    assert slices[0]["spec"]["sharedCounters"] == [{"name": "neuron-chips", "counters": {"chips": {"value": "16"}}}]
    (node,) = [d for s in slices[1:] for d in s["spec"]["devices"] if d["name"] == "neuron-node"]
    assert node["attributes"]["nodeId4"] == {"int": 3}
    assert node["attributes"]["serverId4"] == {"string": class_attrs(host.root)["server_id_4"].strip()}
