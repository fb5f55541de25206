"""NeuronCores as DRA devices (``--core-devices on``, chart ``draDriver.coreDevices.enabled``) without a cluster:
the published pool (counters, devices, attributes, slice limits) and the container edits a core claim gets (the
chart's DeviceClasses: tests/e2e/gotools/test_charts_neuron_core_devices.py). The scheduler's side (a chip never
split between a whole-chip and a core claim) is proven on the real kube-scheduler in
tests/e2e/test_neuron_core_devices_e2e.py.

Outside facts used: a Trainium2 chip has 8 physical NeuronCores; at LNC 2 (the default) the runtime sees 4
logical cores per chip, at LNC 1 8 (neuron.md 1.1, 2.4); Trainium1 has 2 and no LNC; trn2.48xlarge has 16 chips
and an UltraServer node (trn2u) is part of a 4-node set; the runtime in a container numbers the cores of the
``/dev/neuron*`` nodes it has from 0, in ascending device order (runtime 2.16+). resource.k8s.io/v1 limits
(k8s.io/api v0.37.2 resource/v1/types.go): 8 counter sets per slice, 32 counters per set, 2 counter consumptions
per device, 64 devices per slice once a device consumes counters, and a slice holds devices or counters.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from hostcache import copy_host, shared_host

from accel_core.dra.nodelabels import label_attributes, with_attributes
from accel_core.dra.profile import tainted
from accel_core.dra.publisher import build_slices
from accel_core.dra.slicemodel import CounterSet, SliceDevice, SliceValidationError, validate_devices
from accel_core.dra.types import ClaimError
from accel_core.hostscan import held_device_plugin_ids, held_dra_devices
from accel_core.paths import HostPaths
from neuron_dra.deviceplugin.node import NeuronNode
from neuron_dra.discovery import NeuronInventory
from neuron_dra.dra import cli as dra_cli
from neuron_dra.dra import cores
from neuron_dra.dra.config import NeuronConfig
from neuron_dra.dra.profile import NeuronProfile
from neuron_dra.edits import container_edits as device_plugin_edits

CHIP_COUNTERS_TRN2 = {f"core-{p}": 1 for p in range(8)}


def scan(instance_type: str, *, lnc: int | None = None, on: bool = True, **host: Any) -> Any:
    fake = shared_host(instance_type, lnc=lnc, **host)
    return NeuronProfile(core_devices="on" if on else "off").scan(HostPaths(host_root=fake.root), "0.1.0")


def by_name(devices: tuple[SliceDevice, ...]) -> dict[str, SliceDevice]:
    return {d.name: d for d in devices}


# -- the pool --------------------------------------------------------------------------------------------------------
def test_trn2_chips_share_per_core_counters_with_their_logical_cores() -> None:
    s = scan("trn2.48xlarge")
    devs = by_name(s.devices)
    chips = [f"neuron-device-{i}" for i in range(16)]
    core_names = [f"neuron-device-{i}-core-{k}" for i in range(16) for k in range(4)]  # LNC 2: 4 per chip
    assert list(devs) == chips + core_names
    assert {c.name: dict(c.counters) for c in s.counters} == {chip: CHIP_COUNTERS_TRN2 for chip in chips}
    for i in range(16):
        assert devs[f"neuron-device-{i}"].consumes == {f"neuron-device-{i}": CHIP_COUNTERS_TRN2}
        for k in range(4):  # logical core k at LNC 2 = physical cores 2k and 2k+1
            assert devs[f"neuron-device-{i}-core-{k}"].consumes == {
                f"neuron-device-{i}": {f"core-{2 * k}": 1, f"core-{2 * k + 1}": 1}}
    validate_devices(s.devices, s.counters)


def test_core_devices_carry_the_chips_attributes_for_cel() -> None:
    devs = by_name(scan("trn2.48xlarge").devices)
    chip, core = devs["neuron-device-5"].attributes, devs["neuron-device-5-core-3"].attributes
    assert core["resourceType"] == "neuron_core" and chip["resourceType"] == "neuron_device"
    assert core["deviceId"] == 5 and core["coreIndex"] == 3 and core["logicalNeuronCore"] == 2
    # cores of one chip: deviceId; of connected chips and next to an EFA: the chip's EFA groups
    groups = [f"resource.aws.com/devicegroup{n}_id" for n in (1, 4, 8, 16)]
    assert set(core) == {"resourceType", "deviceId", "coreIndex", "logicalNeuronCore", "instanceType", *groups}
    for key in ("instanceType", *groups):
        assert core[key] == chip[key], key
    assert "coreIndex" not in chip


def test_lnc_1_gives_8_core_devices_of_one_physical_core_each() -> None:
    devs = by_name(scan("trn2.48xlarge", lnc=1).devices)
    assert sum(d.endswith("-core-7") for d in devs) == 16 and "neuron-device-0-core-8" not in devs
    assert devs["neuron-device-2-core-5"].consumes == {"neuron-device-2": {"core-5": 1}}
    assert devs["neuron-device-2-core-5"].attributes["logicalNeuronCore"] == 1


def test_trn1_has_two_cores_per_chip_and_no_lnc_attribute() -> None:
    devs = by_name(scan("trn1.32xlarge").devices)
    assert [n for n in devs if n.startswith("neuron-device-3-")] == ["neuron-device-3-core-0", "neuron-device-3-core-1"]
    assert devs["neuron-device-3"].consumes == {"neuron-device-3": {"core-0": 1, "core-1": 1}}
    assert "logicalNeuronCore" not in devs["neuron-device-3-core-1"].attributes


def test_off_publishes_exactly_the_chips_as_before() -> None:
    off, on = scan("trn2.48xlarge", on=False), scan("trn2.48xlarge")
    assert off.counters == () and [d.name for d in off.devices] == [f"neuron-device-{i}" for i in range(16)]
    assert all(not d.consumes for d in off.devices)
    assert [d.attributes for d in off.devices] == [by_name(on.devices)[d.name].attributes for d in off.devices]


def test_slices_keep_the_api_limits() -> None:
    s = scan("trn2u.48xlarge", lnc=1, ultraserver_id="us-1", ultraserver_node=0)  # the largest pool: 16 + 128 + 1
    slices = [o.to_dict()["spec"] for o in build_slices("neuron.aws.com", "n1", s.devices, counters=s.counters)]
    counter_slices = [sp for sp in slices if sp.get("sharedCounters")]
    device_slices = [sp for sp in slices if sp.get("devices")]
    assert all(not (sp.get("sharedCounters") and sp.get("devices")) for sp in slices)
    assert all(len(sp["sharedCounters"]) <= 8 for sp in counter_slices)
    assert sum(len(sp["sharedCounters"]) for sp in counter_slices) == 17  # 16 chips + neuron-chips
    assert all(len(sp["devices"]) <= 64 for sp in device_slices)
    assert sum(len(sp["devices"]) for sp in device_slices) == 16 + 128 + 1
    assert {sp["pool"]["resourceSliceCount"] for sp in slices} == {len(slices)}
    for sp in device_slices:
        for dev in sp["devices"]:
            assert len(dev.get("consumesCounters") or []) <= 2, dev["name"]
    names = [c["name"] for sp in counter_slices for c in sp["sharedCounters"]]
    assert len(names) == len(set(names))


def test_ultraserver_node_device_waits_for_every_chip_and_core() -> None:
    s = scan("trn2u.48xlarge", ultraserver_id="us-1", ultraserver_node=2)
    devs = by_name(s.devices)
    chips_set = next(c for c in s.counters if c.name == "neuron-chips")
    assert dict(chips_set.counters) == {"chips": 16, "cores": 128}
    assert devs["neuron-node"].consumes == {"neuron-chips": {"chips": 16, "cores": 128}}
    assert devs["neuron-device-7"].consumes == {"neuron-chips": {"chips": 1}, "neuron-device-7": CHIP_COUNTERS_TRN2}
    assert devs["neuron-device-7-core-1"].consumes == {"neuron-chips": {"cores": 2},
                                                        "neuron-device-7": {"core-2": 1, "core-3": 1}}


def test_limits_are_checked_before_publishing() -> None:
    three = SliceDevice("d", consumes={"a": {"x": 1}, "b": {"x": 1}, "c": {"x": 1}})
    sets = tuple(CounterSet(n, {"x": 1}) for n in "abc")
    with pytest.raises(SliceValidationError, match="device d: consumes from 3 counter sets, more than 2"):
        validate_devices([three], sets)
    with pytest.raises(SliceValidationError, match="counter set 'a': 33 counters"):
        validate_devices([], (CounterSet("a", {f"c{i}": 1 for i in range(33)}),))
    with pytest.raises(SliceValidationError, match="counter set 'a': name used twice"):
        validate_devices([], (CounterSet("a", {"x": 1}), CounterSet("a", {"y": 1})))
    with pytest.raises(SliceValidationError, match="'core_0' is not a DNS label"):
        validate_devices([], (CounterSet("a", {"core_0": 1}),))


# -- prepare ---------------------------------------------------------------------------------------------------------
def edits(devices: list[str], config: NeuronConfig | None = None, *, numbering: str = "container",
          lnc: int | None = None) -> tuple[list[str], dict[str, str], dict[str, Any]]:
    fake = shared_host("trn2.48xlarge", lnc=lnc)
    profile = NeuronProfile(core_numbering=numbering, core_devices="on")  # type: ignore[arg-type]
    inv: NeuronInventory = profile.scan(HostPaths(host_root=fake.root), "0.1.0").inventory
    out = profile.container_edits(inv, "cores", devices, config or NeuronConfig())
    nodes = sorted({n.path for e in out.devices.values() for n in e.device_nodes})
    assert set(out.devices) == set(devices)
    return nodes, dict(out.request.env), {k: dict(v.data) for k, v in out.status.items()}


def test_one_core_gets_its_chip_and_that_core_only() -> None:
    nodes, env, status = edits(["neuron-device-4-core-2"])
    assert nodes == ["/dev/neuron4"]
    assert env == {"NEURON_RT_VISIBLE_CORES": "2"}  # the container sees only /dev/neuron4: its cores are 0-3
    assert status["neuron-device-4-core-2"] == {"index": 4, "coreIndex": 2, "visibleCores": "2", "logicalNeuronCore": 2}
    _, host_env, _ = edits(["neuron-device-4-core-2"], numbering="host")
    assert host_env == {"NEURON_RT_VISIBLE_CORES": "18"}  # 4 chips x 4 cores before it


def test_cores_of_two_chips_as_the_device_plugin_numbers_them() -> None:
    nodes, env, _ = edits(["neuron-device-9-core-0", "neuron-device-4-core-1", "neuron-device-4-core-2"])
    assert nodes == ["/dev/neuron4", "/dev/neuron9"]
    assert env == {"NEURON_RT_VISIBLE_CORES": "1-2,4"}  # chip 4 first (cores 0-3), chip 9 next (4-7)
    # the device plugin's Allocate for aws.amazon.com/neuroncore IDs 17, 18 and 36 gives the same
    dp = device_plugin_edits([4, 9], [17, 18, 36], cores_per_device=4, lnc=None)
    assert dict(dp.env) == env and sorted(n.path for n in dp.device_nodes) == nodes


def test_a_core_and_a_whole_chip_in_one_request() -> None:
    nodes, env, status = edits(["neuron-device-1", "neuron-device-3-core-3"])
    assert nodes == ["/dev/neuron1", "/dev/neuron3"]
    assert env == {"NEURON_RT_VISIBLE_CORES": "0-3,7"}
    assert status["neuron-device-1"]["visibleCores"] == "0-3"
    assert status["neuron-device-3-core-3"]["visibleCores"] == "7"


def test_claim_lnc_1_splits_a_logical_core_into_its_two_physical_cores() -> None:
    _, env, status = edits(["neuron-device-4-core-1"], NeuronConfig(logical_neuron_core=1))
    assert env == {"NEURON_RT_VISIBLE_CORES": "2-3", "NEURON_LOGICAL_NC_CONFIG": "1"}  # physical 2, 3 of 0-7
    assert status["neuron-device-4-core-1"]["logicalNeuronCore"] == 1


def test_claim_lnc_2_needs_whole_pairs_on_an_lnc_1_node() -> None:
    _, env, _ = edits(["neuron-device-0-core-2", "neuron-device-0-core-3"], NeuronConfig(logical_neuron_core=2),
                      lnc=1)
    assert env == {"NEURON_RT_VISIBLE_CORES": "1", "NEURON_LOGICAL_NC_CONFIG": "2"}
    with pytest.raises(ClaimError, match=r"request cores: logicalNeuronCore: 2 needs whole pairs .*"
                                         r"neuron-device-0-core-3 of neuron-device-0"):
        edits(["neuron-device-0-core-3"], NeuronConfig(logical_neuron_core=2), lnc=1)


def test_unknown_cores_are_refused_by_name() -> None:
    with pytest.raises(ClaimError, match=r"device neuron-device-4-core-4 \(request cores\) is not a NeuronCore of "
                                         r"this node: neuron-device-4 has 4 logical cores"):
        edits(["neuron-device-4-core-4"])
    with pytest.raises(ClaimError, match="device neuron-device-16-core-0 .* not a Neuron device of this node"):
        edits(["neuron-device-16-core-0"])


def test_core_device_names_parse_strictly() -> None:
    assert cores.parse_core_device("neuron-device-3-core-1") == (3, 1)
    for name in ("neuron-device-3", "neuron-device-03-core-1", "neuron-device-3-core-", "neuron-device-3-core-x",
                 "neuron-node", "neuron-device-3-core-1-core-2"):
        assert cores.parse_core_device(name) is None, name


# -- coexistence with the device plugin ------------------------------------------------------------------------------
def test_device_plugin_holds_reach_core_devices_and_the_other_way() -> None:
    """aws.amazon.com/neuroncore IDs are global logical core indices (neuron.md 1.4): chip 3's cores are 12-15 at
    LNC 2. A device-plugin pod holding core 13 keeps chip 3 and its core 1 unpublished, not the chip's other cores;
    one holding chip 3 (neuron ID 3) keeps all of them; a DRA claim on chip 3's core 1 keeps neuron 3 and core 13
    from the device plugin."""
    fake = shared_host("trn2.48xlarge")
    profile = NeuronProfile(core_devices="on")
    inv = profile.scan(HostPaths(host_root=fake.root), "0.1.0").inventory
    ids = profile.scanner.device_plugin_ids(inv)
    assert held_dra_devices(ids, {"aws.amazon.com/neuroncore": {"13"}}) == {"neuron-device-3",
                                                                           "neuron-device-3-core-1"}
    assert held_dra_devices(ids, {"aws.amazon.com/neuron": {"3"}}) == {
        "neuron-device-3", *(f"neuron-device-3-core-{k}" for k in range(4))}
    assert held_device_plugin_ids(ids, ["neuron-device-3-core-1"]) == {"aws.amazon.com/neuron": {"3"},
                                                                       "aws.amazon.com/neuroncore": {"13"}}
    off = NeuronProfile()
    assert set(off.scanner.device_plugin_ids(inv)) == {f"neuron-device-{i}" for i in range(16)}


def test_the_device_plugin_withholds_the_chip_and_core_of_a_claim_on_a_core_device() -> None:
    """On a node handed back to the device plugin (a rollback), a running pod's claim on ``neuron-device-3-core-1``
    keeps chip 3 (``aws.amazon.com/neuron`` 3) and its core (``aws.amazon.com/neuroncore`` 13 = 3 * 4 + 1 at LNC 2)
    from being advertised, as for a claim on the whole chip; the plugin knows the names whatever the driver's
    setting was."""
    node = NeuronNode(HostPaths(host_root=shared_host("trn2.48xlarge").root))
    node.rediscover()
    ids = node.scanner.device_plugin_ids(node.inventory)
    assert held_device_plugin_ids(ids, ["neuron-device-3-core-1"]) == {"aws.amazon.com/neuron": {"3"},
                                                                       "aws.amazon.com/neuroncore": {"13"}}
    assert held_device_plugin_ids(ids, ["neuron-device-5"]) == {
        "aws.amazon.com/neuron": {"5"}, "aws.amazon.com/neuroncore": {str(c) for c in range(20, 24)}}


def test_a_sick_chip_makes_its_cores_sick_and_they_get_its_taint(tmp_path: Path) -> None:
    """Uncorrected memory errors make a Neuron device unhealthy (docs/neuron-dra-driver.md, "Health"); its cores
    are that device, so they are published with the same taint and the other chips' cores are not."""
    host = copy_host(tmp_path / "h", "trn2.48xlarge")
    host.set_neuron_counter(3, "stats/hardware/mem_ecc_uncorrected/total", 2)
    s = NeuronProfile(core_devices="on").scan(HostPaths(host_root=host.root), "0.1.0")
    assert not s.health["neuron-device-3"].healthy
    assert [s.health[f"neuron-device-3-core-{k}"] for k in range(4)] == [s.health["neuron-device-3"]] * 4
    assert s.health["neuron-device-4-core-0"].healthy
    taints = {d.name: d.taints for d in tainted("neuron.aws.com", s.devices, s.health)}
    assert taints["neuron-device-3-core-2"] == taints["neuron-device-3"] != ()
    assert taints["neuron-device-4-core-0"] == ()


# -- the command line ------------------------------------------------------------------------------------------------
def test_slices_with_core_devices_from_the_flag_or_the_chart_env(monkeypatch: pytest.MonkeyPatch,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    root = str(shared_host("trn2.48xlarge").root)
    args = ["slices", "--host-root", root, "--node-name", "n1", "--output", "json"]

    def printed() -> tuple[list[int], list[int]]:
        slices = json.loads(capsys.readouterr().out)
        return ([len(s["spec"].get("sharedCounters") or []) for s in slices],
                [len(s["spec"].get("devices") or []) for s in slices])

    assert dra_cli.main(args) == 0
    assert printed() == ([0], [16])  # off by default: the chips alone
    assert dra_cli.main([*args, "--core-devices", "on"]) == 0
    assert printed() == ([8, 8, 0, 0], [0, 0, 64, 16])  # 16 counter sets, 8 per slice; 80 devices, 64 per slice
    monkeypatch.setenv("CORE_DEVICES", "on")  # what the chart sets
    assert dra_cli.main(args) == 0
    assert printed() == ([8, 8, 0, 0], [0, 0, 64, 16])
    monkeypatch.setenv("CORE_DEVICES", "yes")
    with pytest.raises(SystemExit):
        dra_cli.main(args)
    assert "CORE_DEVICES" in capsys.readouterr().err


# -- opt-in per node pool --------------------------------------------------------------------------------------------
def test_node_label_mode_publishes_cores_only_on_opted_in_nodes() -> None:
    """``--core-devices node-label``: what the driver publishes goes through the Node-label attributes
    (accel_core.dra.nodelabels.with_attributes, as serve does): the cores only while the Node carries
    ``neuron.aws.com/core-devices=true``, which also reaches every device as ``coreDevices``."""
    fake = shared_host("trn2.48xlarge")
    s = NeuronProfile(core_devices="node-label").scan(HostPaths(host_root=fake.root), "0.1.0")
    assert s.node_label_attributes["neuron.aws.com/core-devices"] == "coreDevices"
    assert s.node_label_attributes["topology.k8s.aws/capacity-block-id"] == "capacityBlockId"  # AWS's kept
    mapping = s.node_label_attributes

    def published(labels: dict[str, str]) -> list[SliceDevice]:
        return with_attributes(s.devices, label_attributes(labels, mapping))

    chips = [f"neuron-device-{i}" for i in range(16)]
    assert [d.name for d in published({})] == chips
    assert [d.name for d in published({"neuron.aws.com/core-devices": "false"})] == chips
    opted = published({"neuron.aws.com/core-devices": "true"})
    assert len(opted) == 16 + 64 and all(d.attributes["coreDevices"] == "true" for d in opted)
    # the chips consume the counters either way, so the pool is valid with and without the cores
    validate_devices(published({}), s.counters)
    validate_devices(opted, s.counters)
    assert "neuron.aws.com/core-devices" not in NeuronProfile(core_devices="on").scan(
        HostPaths(host_root=fake.root), "0.1.0").node_label_attributes


def test_a_node_that_did_not_opt_in_publishes_exactly_the_pool_without_core_devices() -> None:
    """No counters, no consumption, the same chips: what whole-chip pods cost the scheduler there is unchanged."""
    fake = shared_host("trn2.48xlarge")
    gated = NeuronProfile(core_devices="node-label").scan(HostPaths(host_root=fake.root), "0.1.0")
    off = NeuronProfile().scan(HostPaths(host_root=fake.root), "0.1.0")

    def specs(devices: list[SliceDevice], counters: tuple[CounterSet, ...]) -> list[dict[str, Any]]:
        return [o.to_dict()["spec"] for o in build_slices("neuron.aws.com", "n1", devices, counters=counters)]

    assert specs(with_attributes(gated.devices, {}), gated.counters) == specs(list(off.devices), off.counters)
    opted = specs(with_attributes(gated.devices, {"coreDevices": "true"}), gated.counters)
    assert len(opted) == 4 and sum(len(sp.get("sharedCounters") or []) for sp in opted) == 16
