"""Attribute parity with AWS's Neuron DRA driver: ``resource.kubernetes.io/numaNode`` from sysfs (absent for -1) on
Neuron and EFA devices, and ``networkNodeLayer1..3`` / ``capacityBlockId`` from the Node's labels on every device
(:mod:`accel_core.dra.nodelabels`)."""

from __future__ import annotations

from pathlib import Path

import pytest
from hostcache import copy_host, shared_host
from neuron_listings import TRN2_48XLARGE_GUIDE

from accel_core.awsfacts import catalog
from accel_core.dra.nodelabels import AWS_TOPOLOGY_LABELS, label_attributes, with_attributes
from accel_core.dra.slicemodel import MAX_ATTRIBUTES_AND_CAPACITIES, SliceDevice, validate_devices
from accel_core.paths import HostPaths
from efa_plugin.dra.profile import EfaProfile
from neuron_dra.dra.profile import NeuronProfile

NUMA = "resource.kubernetes.io/numaNode"
# The label keys and attribute names as AWS documents them (dra-137.md "AWS's Neuron DRA driver attributes").
LABELS = {"topology.k8s.aws/network-node-layer-1": "nn-1", "topology.k8s.aws/network-node-layer-2": "nn-2",
          "topology.k8s.aws/network-node-layer-3": "nn-3", "topology.k8s.aws/capacity-block-id": "cr-0abc"}
ATTRS = {"networkNodeLayer1": "nn-1", "networkNodeLayer2": "nn-2", "networkNodeLayer3": "nn-3",
         "capacityBlockId": "cr-0abc"}


def _paths(root: Path) -> HostPaths:
    return HostPaths(host_root=root)


def test_trn2_neuron_devices_carry_the_numa_node_neuron_ls_prints() -> None:
    scan = NeuronProfile().scan(_paths(shared_host("trn2.48xlarge").root), "1.2.3")
    by_name = {d.name: d.attributes for d in scan.devices}
    for index, (_, _, numa) in TRN2_48XLARGE_GUIDE.items():
        assert by_name[f"neuron-device-{index}"][NUMA] == numa, index
    assert scan.node_label_attributes == AWS_TOPOLOGY_LABELS


def test_numa_node_minus_one_publishes_no_numa_attribute(tmp_path: Path) -> None:
    fake = copy_host(tmp_path / "host", "trn2.48xlarge")
    bdf = TRN2_48XLARGE_GUIDE[5][1]
    fake.write(f"sys/bus/pci/devices/{bdf}/numa_node", "-1\n")
    attrs = {d.name: d.attributes for d in NeuronProfile().scan(_paths(fake.root), "1.2.3").devices}
    assert NUMA not in attrs["neuron-device-5"] and "numaNode" not in attrs["neuron-device-5"]
    assert attrs["neuron-device-4"][NUMA] == 0


def test_efa_devices_carry_numa_node_and_none_for_minus_one(tmp_path: Path) -> None:
    # efa.md 2.2, p4d.24xlarge: roots 10 and 20 on NUMA 0, 90 and a0 on NUMA 1.
    fake = copy_host(tmp_path / "host", "p4d.24xlarge")
    fake.write("sys/bus/pci/devices/0000:a0:1b.0/numa_node", "-1\n")
    scan = EfaProfile().scan(_paths(fake.root), "1.2.3")
    attrs = {d.name: d.attributes for d in scan.devices}
    assert attrs["efa-0000-10-1b-0"][NUMA] == 0
    assert attrs["efa-0000-20-1b-0"][NUMA] == 0
    assert attrs["efa-0000-90-1b-0"][NUMA] == 1
    assert NUMA not in attrs["efa-0000-a0-1b-0"]
    assert scan.node_label_attributes == AWS_TOPOLOGY_LABELS


def test_labels_map_to_attributes_and_absent_or_empty_labels_give_none() -> None:
    assert label_attributes(LABELS, AWS_TOPOLOGY_LABELS) == ATTRS
    assert label_attributes({"topology.k8s.aws/network-node-layer-1": "nn-abc", "other": "x"},
                            AWS_TOPOLOGY_LABELS) == {"networkNodeLayer1": "nn-abc"}
    assert label_attributes({"topology.k8s.aws/capacity-block-id": ""}, AWS_TOPOLOGY_LABELS) == {}
    assert label_attributes(None, AWS_TOPOLOGY_LABELS) == {}
    assert label_attributes(LABELS, {}) == {}


def test_label_attributes_join_every_device_and_the_devices_own_win() -> None:
    devices = [SliceDevice("a", {"deviceId": 0}), SliceDevice("b", {"capacityBlockId": "own"})]
    out = with_attributes(devices, ATTRS)
    assert out[0].attributes == {"deviceId": 0, **ATTRS}
    assert out[1].attributes["capacityBlockId"] == "own" and out[1].attributes["networkNodeLayer3"] == "nn-3"
    assert with_attributes(devices, {}) == devices


def test_a_device_without_room_keeps_its_attributes() -> None:
    full = SliceDevice("full", {f"a{i}": i for i in range(MAX_ATTRIBUTES_AND_CAPACITIES - 2)})
    out = with_attributes([full], ATTRS)
    assert out == [full]
    validate_devices(out)


@pytest.mark.parametrize("instance_type", [t for t in catalog.names()
                                           if catalog.get(t).neuron is not None or catalog.get(t).efa is not None])
def test_every_catalog_type_stays_valid_with_every_label_at_its_longest(instance_type: str) -> None:
    longest = {label: "x" * 63 for label in AWS_TOPOLOGY_LABELS}  # a label value has at most 63 characters
    paths = _paths(shared_host(instance_type).root)
    for profile in (NeuronProfile(), EfaProfile()):
        devices = with_attributes(profile.scan(paths, "1.2.3").devices, label_attributes(longest, AWS_TOPOLOGY_LABELS))
        validate_devices(devices)
        assert all(d.attributes["networkNodeLayer2"] == "x" * 63 for d in devices), instance_type
