"""Neuron DRA slice contents: EFA-proximity device groups, per-device attributes within the v1 limits for every
catalog type, and the torus attributes."""

from __future__ import annotations

from pathlib import Path

import pytest
from hostcache import copy_host, shared_host
from neuron_listings import TRN2_48XLARGE_GUIDE

import efa_plugin
import neuron_dra.facts
from accel_core.awsfacts import catalog
from accel_core.awsfacts import neuron_efa as dg
from accel_core.dra.profile import tainted
from accel_core.dra.publisher import build_slices
from accel_core.dra.slicemodel import (
    MAX_ATTRIBUTES_AND_CAPACITIES,
    SliceDevice,
    SliceValidationError,
    Version,
    validate_devices,
)
from accel_core.paths import HostPaths
from efa_plugin.facts import neuron_efa_map
from neuron_dra import DRA_DRIVER_NAME
from neuron_dra.discovery import discover
from neuron_dra.dra.attributes import UNHEALTHY_TAINT_KEY, device_index, device_name, slice_devices
from neuron_dra.dra.profile import NeuronProfile
from neuron_dra.health_rule import assess

NEURON_TYPES = [t for t in catalog.names() if catalog.get(t).neuron is not None]


def neuron_spec(instance_type: str) -> catalog.NeuronSpec:
    spec = catalog.get(instance_type).neuron
    assert spec is not None
    return spec


def _inventory(instance_type: str):  # type: ignore[no-untyped-def]
    """Discovery over the session's read-only tree of that type."""
    return discover(HostPaths(host_root=shared_host(instance_type).root))


# -- device groups --------------------------------------------------------------------------------------------------
def test_device_group_ids_match_the_mapping_library_vectors() -> None:
    # Vectors published with the AWS mapping library's own tests (trn2 table, Neuron device 0).
    assert dg.neuron_device_group_ids("trn2.48xlarge", 0) == {
        "resource.aws.com/devicegroup1_id": "0000:c9:00.0",
        "resource.aws.com/devicegroup4_id": "13713e551cd37c19",
        "resource.aws.com/devicegroup8_id": "3593812b8066a078",
        "resource.aws.com/devicegroup16_id": "821d14afaf11327d",
    }
    assert dg.group_hash(["0000:ca:00.0", "0000:c9:00.0", "0000:c9:00.0"]) == "5ba52364feae51b7"
    assert dg.group_hash([]) == "e3b0c44298fc1c14"


def test_groups_follow_aligned_blocks_and_family_tables() -> None:
    ids = [dg.neuron_device_group_ids("trn2.48xlarge", i) for i in range(16)]
    assert len({i[dg.DEVICEGROUP4_ID] for i in ids}) == 4
    assert {ids[i][dg.DEVICEGROUP4_ID] for i in range(4, 8)} == {ids[4][dg.DEVICEGROUP4_ID]}
    assert ids[3][dg.DEVICEGROUP4_ID] != ids[4][dg.DEVICEGROUP4_ID]
    assert ids[7][dg.DEVICEGROUP8_ID] == ids[0][dg.DEVICEGROUP8_ID] != ids[8][dg.DEVICEGROUP8_ID]
    assert len({i[dg.DEVICEGROUP16_ID] for i in ids}) == 1
    # trn2u and trn2e use the trn2 table; trn1 pairs two devices per EFA
    assert dg.neuron_device_group_ids("trn2u.48xlarge", 5) == ids[5]
    trn1 = [dg.neuron_device_group_ids("trn1.32xlarge", i)[dg.DEVICEGROUP1_ID] for i in range(16)]
    assert trn1[0] == trn1[1] == "0000:10:1a.0" and trn1[2] == trn1[3] == "0000:a0:1a.0"
    assert dg.neuron_device_group_ids("trn3-dev0.48xlarge", 0)[dg.DEVICEGROUP1_ID] == "0000:a9:00.0"


@pytest.mark.parametrize("instance_type", ["trn1.2xlarge", "trn2.3xlarge", "inf2.48xlarge", "p5.48xlarge", ""])
def test_non_efa_types_get_no_group_ids(instance_type: str) -> None:
    assert dg.neuron_device_group_ids(instance_type, 0) == {}


def test_unknown_index_gets_no_group_ids_and_efa_side_agrees() -> None:
    assert dg.neuron_device_group_ids("trn2.48xlarge", 16) == {}
    assert dg.neuron_device_group_ids("trn2.48xlarge", -1) == {}
    # an EFA device gets the ids of the Neuron device it serves (what DRANET publishes for matchAttribute)
    assert dg.efa_device_group_ids("trn2.48xlarge", "0000:c9:00.0") == dg.neuron_device_group_ids("trn2.48xlarge", 0)
    assert dg.efa_device_group_ids("trn1.32xlarge", "0000:10:1a.0")[dg.DEVICEGROUP4_ID] == \
        dg.neuron_device_group_ids("trn1.32xlarge", 0)[dg.DEVICEGROUP4_ID]
    assert dg.efa_device_group_ids("trn2.48xlarge", "0000:00:06.0") == {}


def test_the_tables_are_the_one_copy_and_the_catalog_must_fit_them(tmp_path: Path) -> None:
    # the instance catalog does not repeat which Neuron devices an EFA serves: it joins in the tables
    efa_file, neuron_file = (Path(m.__file__ or "").with_name("instances.yaml") for m in (efa_plugin, neuron_dra.facts))
    yaml_text = efa_file.read_text()
    assert all("near_neurons:" not in p.read_text() and "efa_mapping_library:" not in p.read_text()
               for p in (efa_file, neuron_file))
    assert neuron_efa_map(catalog.get("trn1.32xlarge"))[13] == "0000:10:19.0"  # neuron.md section 3 (trn1)
    # a catalog whose trn2.48xlarge lacks an EFA of the table is refused, naming the type
    broken = tmp_path / "instances.yaml"
    broken.write_text(yaml_text.replace('bdf: "0000:c9:00.0", root: pci0000:a8',
                                        'bdf: "0000:c8:00.0", root: pci0000:a8'))
    with pytest.raises(catalog.CatalogError, match=r"trn2\.48xlarge: the Neuron-to-EFA table .*0000:c9:00.0"):
        catalog.load(broken, neuron_file)


# -- attributes -------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("instance_type", NEURON_TYPES)
def test_every_catalog_type_publishes_valid_devices(tmp_path: Path, instance_type: str) -> None:
    inv = _inventory(instance_type)
    devices = slice_devices(inv, "0.1.0")
    validate_devices(devices)  # raises on any limit
    spec = neuron_spec(instance_type)
    assert [d.name for d in devices] == [f"neuron-device-{i}" for i in range(len(spec.devices))]
    for dev in devices:
        assert len(dev.attributes) + len(dev.capacity) <= MAX_ATTRIBUTES_AND_CAPACITIES
        assert dev.attributes["instanceType"] == instance_type
        assert dev.attributes["resourceType"] == "neuron_device"
        assert dev.attributes["draDriverVersion"] == Version("0.1.0")
        assert dev.capacity == {}  # AWS's attribute reference (neuron.md 2.3) names no capacity
        assert not dev.taints
        has_groups = dg.DEVICEGROUP4_ID in dev.attributes
        assert has_groups == spec.efa_mapping_library
        assert ("topology_x" in dev.attributes) == (spec.topology == "torus4x4")
    slices = build_slices("neuron.aws.com", "n1", devices)
    assert len(slices) == 1 and slices[0].to_dict()["spec"]["pool"] == {
        "name": "n1", "generation": 1, "resourceSliceCount": 1}


def test_trn2_torus_rows_and_pci(tmp_path: Path) -> None:
    inv = _inventory("trn2.48xlarge")
    devices = {d.name: d for d in slice_devices(inv, "1.2.3")}
    for i in range(16):
        attrs = devices[device_name(i)].attributes
        assert (attrs["deviceId"], attrs["topology_x"], attrs["topology_y"]) == (i, i // 4, i % 4)
        assert (attrs["topology4_id"], attrs["topology8_id"]) == (i // 4, i // 8)
        assert attrs[dg.DEVICEGROUP1_ID] == dg.NEURON_TO_EFA["trn2"][i]
    d0 = devices["neuron-device-0"].attributes
    _, bdf, numa = TRN2_48XLARGE_GUIDE[0]  # a real neuron-ls listing
    assert d0["resource.kubernetes.io/pciBusID"] == bdf and d0["numaNode"] == numa
    assert d0["resource.kubernetes.io/pcieRoot"] == "pci0000:a8"  # the fake host's root of that bus
    assert d0["neuronDriverVersion"] == "2.25.4.0"


def test_unhealthy_devices_are_tainted(tmp_path: Path) -> None:
    host = copy_host(tmp_path, "trn1.32xlarge")
    host.remove_neuron(3)
    host.set_neuron_counter(5, "stats/hardware/mem_ecc_uncorrected/total", 2)
    scan = NeuronProfile().scan(HostPaths(host_root=tmp_path), "0.1.0")
    cond = scan.health
    assert (cond["neuron-device-3"].healthy, cond["neuron-device-3"].reason) == (False, "DeviceMissing")
    assert (cond["neuron-device-5"].healthy, cond["neuron-device-5"].reason) == (False, "UncorrectedErrors")
    assert cond["neuron-device-0"].healthy
    devices = {d.name: d for d in tainted(DRA_DRIVER_NAME, scan.devices, cond)}  # what the service publishes
    assert [(t.key, t.value, t.effect) for t in devices["neuron-device-3"].taints] == [
        (UNHEALTHY_TAINT_KEY, "DeviceMissing", "NoSchedule")]
    assert devices["neuron-device-5"].taints[0].value == "UncorrectedErrors"
    assert not devices["neuron-device-0"].taints
    validate_devices(list(devices.values()))


def test_dev_node_missing_is_unhealthy(tmp_path: Path) -> None:
    host = copy_host(tmp_path, "inf2.xlarge")
    host.remove_dev_node("/dev/neuron0")
    cond = assess(discover(HostPaths(host_root=tmp_path)))
    assert (cond[0].healthy, cond[0].reason) == (False, "DevNodeMissing")
    assert "/dev/neuron0" in cond[0].message


def test_device_index_parsing() -> None:
    assert device_index("neuron-device-12") == 12
    for bad in ("neuron-device-", "neuron-device-01", "gpu-0", "neuron-device-1a"):
        assert device_index(bad) is None


def test_limits_are_checked_locally_naming_the_device() -> None:
    ok = {"a": 1}
    cases = [
        (SliceDevice("dev-0", {"s": "x" * 65}), "dev-0.*65 characters"),
        (SliceDevice("dev-1", {f"a{i}": i for i in range(30)}, {"c1": 1, "c2": 2, "c3": 3}), "dev-1.*33"),
        (SliceDevice("dev-2", {"bad-name": 1}), "dev-2.*C identifier"),
        (SliceDevice("dev-3", {"Bad_Domain.com/x": 1}), "dev-3.*DNS subdomain"),
        (SliceDevice("dev-4", {"v": Version("1.0")}), "dev-4.*semantic version"),
        (SliceDevice("Dev_5", ok), "'Dev_5'.*DNS label"),
        (SliceDevice("dev-6", ok, {"memory": "lots"}), "dev-6.*quantity"),
        (SliceDevice("dev-7", {"i": 2**63}), "dev-7.*int64"),
    ]
    for device, pattern in cases:
        with pytest.raises(SliceValidationError, match=pattern):
            validate_devices([device])
    with pytest.raises(SliceValidationError, match="dev-8.*twice"):
        validate_devices([SliceDevice("dev-8"), SliceDevice("dev-8")])
    validate_devices([SliceDevice("dev-9", {"s": "x" * 64, "example.com/q": True}, {"memory": "96Gi"})])
