"""The EFA DRA profile without sockets: what it publishes (checked against efa.md and neuron.md), health taints,
strict config, container edits and CDI specs through the core handler, and the coexistence guard.

Expected values are written down from the reference documents, never computed with our tables."""

from __future__ import annotations

import json
import socket
from pathlib import Path
from typing import Any

import pytest
from cdi_oracle import assert_cdi_accepts
from drarig import DriverRig
from hostcache import copy_host, shared_host

from accel_core.awsfacts import catalog
from accel_core.deviceplugin.daemon import DevicePluginService
from accel_core.dra.config import ConfigError
from accel_core.dra.profile import tainted
from accel_core.dra.slicemodel import SliceDevice, Version, validate_devices
from accel_core.dra.types import ClaimError
from accel_core.fakehost import FakeHost
from accel_core.paths import HostPaths
from efa_plugin.daemon import PLUGIN
from efa_plugin.dra.cli import main
from efa_plugin.dra.profile import EfaConfig, EfaProfile
from efa_plugin.policy import EfaPolicy
from neuron_dra.dra.profile import NeuronProfile

NODE = "node-a"
DRIVER = "efa.aws.com"

# efa.md section 2.2, p4d.24xlarge: 0000:{10,20,90,a0}:1b.0 = rdmap{16,32,144,160}s27; roots 10 and 20 on NUMA 0,
# 90 and a0 on NUMA 1.
P4D = {"0000:10:1b.0": ("rdmap16s27", "pci0000:10", 0), "0000:20:1b.0": ("rdmap32s27", "pci0000:20", 0),
       "0000:90:1b.0": ("rdmap144s27", "pci0000:90", 1), "0000:a0:1b.0": ("rdmap160s27", "pci0000:a0", 1)}
# neuron.md section 3, trn2 table: Neuron device i -> EFA on bus TRN2_BUS[i], function 00.0.
TRN2_BUS = ["c9", "b4", "b3", "ca", "6c", "57", "56", "6d", "98", "83", "82", "99", "f5", "e0", "df", "f6"]
# The AWS mapping library's own test vector for the trn2 table, Neuron device 0 (and so its EFA, 0000:c9:00.0).
TRN2_DEVICE0_GROUPS = {"resource.aws.com/devicegroup1_id": "0000:c9:00.0",
                       "resource.aws.com/devicegroup4_id": "13713e551cd37c19",
                       "resource.aws.com/devicegroup8_id": "3593812b8066a078",
                       "resource.aws.com/devicegroup16_id": "821d14afaf11327d"}


def host(tmp_path: Path, instance_type: str, *, shared: bool = False) -> tuple[FakeHost, HostPaths]:
    """The host (``shared``: the session's read-only tree, else a copy to change) with kubelet and CDI dirs."""
    fake = shared_host(instance_type) if shared else copy_host(tmp_path / "host", instance_type)
    return fake, HostPaths(host_root=fake.root, kubelet_root=tmp_path / "kubelet", cdi_root=tmp_path / "cdi",
                           device_plugins=tmp_path / "kubelet" / "device-plugins")


def published(paths: HostPaths, profile: EfaProfile | None = None) -> dict[str, SliceDevice]:
    profile = profile or EfaProfile()
    scan = profile.scan(paths, "1.2.3")
    return {d.name: d for d in tainted(DRIVER, scan.devices, scan.health)}


def test_p4d_attributes_match_the_reference(tmp_path: Path) -> None:
    _, paths = host(tmp_path, "p4d.24xlarge", shared=True)
    devices = published(paths)
    assert sorted(devices) == ["efa-0000-10-1b-0", "efa-0000-20-1b-0", "efa-0000-90-1b-0", "efa-0000-a0-1b-0"]
    for bdf, (ibdev, root, numa) in P4D.items():
        attrs = devices["efa-" + bdf.replace(":", "-").replace(".", "-")].attributes
        assert attrs["pciAddress"] == attrs["resource.kubernetes.io/pciBusID"] == bdf
        assert attrs["rdmaDevice"] == ibdev
        assert attrs["resource.kubernetes.io/pcieRoot"] == root
        assert attrs["numaNode"] == numa
        assert attrs["instanceType"] == "p4d.24xlarge"
        assert attrs["portState"] == "ACTIVE"
        assert attrs["linkLayer"] == "Unknown"  # efa.md 2.4: EFA's link_layer reads Unknown
        assert attrs["draDriverVersion"] == Version("1.2.3")
        assert str(attrs["uverbs"]).startswith("uverbs") and "firmwareVersion" in attrs
        assert not any(k.startswith("resource.aws.com/") for k in attrs), "p4d is not in the Neuron-to-EFA tables"


def test_only_efa_devices_are_published(tmp_path: Path) -> None:
    # efa.md 1.2: p6-b200 has 8 EFA plus 2 mlx5 ibp* devices that are not EFA
    _, paths = host(tmp_path, "p6-b200.48xlarge", shared=True)
    devices = published(paths)
    assert len(devices) == 8
    assert all(str(d.attributes["rdmaDevice"]).startswith("rdmap") for d in devices.values())


@pytest.mark.parametrize("instance_type", [t for t in catalog.names() if catalog.get(t).efa is not None])
def test_every_catalog_type_publishes_valid_devices(tmp_path: Path, instance_type: str) -> None:
    _, paths = host(tmp_path, instance_type, shared=True)
    devices = list(published(paths).values())
    validate_devices(devices)
    assert len(devices) == len(catalog.get(instance_type).efa.devices)


def test_trn2_device_groups_are_the_ones_of_the_neuron_devices_each_efa_serves(tmp_path: Path) -> None:
    _, paths = host(tmp_path, "trn2.48xlarge", shared=True)
    efa = published(paths)
    neuron = {d.name: d for d in NeuronProfile().scan(paths, "1.2.3").devices}
    groups = ("resource.aws.com/devicegroup1_id", "resource.aws.com/devicegroup4_id",
              "resource.aws.com/devicegroup8_id", "resource.aws.com/devicegroup16_id")
    first = efa["efa-0000-c9-00-0"].attributes
    assert {k: first[k] for k in groups} == TRN2_DEVICE0_GROUPS
    for index, bus in enumerate(TRN2_BUS):
        attrs = efa[f"efa-0000-{bus}-00-0"].attributes
        assert {k: attrs[k] for k in groups} == {k: neuron[f"neuron-device-{index}"].attributes[k] for k in groups}


def test_trn1_two_neuron_devices_per_efa(tmp_path: Path) -> None:
    # neuron.md section 3, trn1: (0,1) 10:1a.0, (2,3) a0:1a.0 ... (14,15) a0:19.0; DRANET on trn1 reports
    # 0000:10:19.0 as rdmap16s25 on pci0000:10
    _, paths = host(tmp_path, "trn1.32xlarge", shared=True)
    efa = published(paths)
    neuron = {d.name: d.attributes for d in NeuronProfile().scan(paths, "1.2.3").devices}
    assert len(efa) == 8
    a = efa["efa-0000-10-1a-0"].attributes
    assert a["resource.aws.com/devicegroup1_id"] == neuron["neuron-device-0"]["resource.aws.com/devicegroup1_id"] \
        == neuron["neuron-device-1"]["resource.aws.com/devicegroup1_id"] == "0000:10:1a.0"
    assert a["resource.aws.com/devicegroup4_id"] == neuron["neuron-device-2"]["resource.aws.com/devicegroup4_id"]
    b = efa["efa-0000-10-19-0"].attributes
    assert (b["rdmaDevice"], b["resource.kubernetes.io/pcieRoot"]) == ("rdmap16s25", "pci0000:10")
    assert b["resource.aws.com/devicegroup4_id"] == neuron["neuron-device-12"]["resource.aws.com/devicegroup4_id"]


def test_health_becomes_taints_and_a_vanished_efa_stays_published(tmp_path: Path) -> None:
    fake, paths = host(tmp_path, "p5.48xlarge")
    profile = EfaProfile()
    assert not any(d.taints for d in published(paths, profile).values())
    fake.set_port_state("rdmap80s0", "DOWN")
    fake.remove_efa("rdmap96s0")
    fake.remove_dev_node(f"/dev/infiniband/{fake.uverbs_of('rdmap113s0')}")
    devices = published(paths, profile)
    assert len(devices) == 32, "the vanished EFA keeps its entry"

    def taints(bdf: str) -> list[tuple[str, str, str]]:
        return [(t.key, t.value, t.effect) for t in devices[f"efa-0000-{bdf}-00-0"].taints]

    assert taints("50") == [("efa.aws.com/unhealthy", "PortDown", "NoSchedule")]
    assert taints("60") == [("efa.aws.com/unhealthy", "DeviceMissing", "NoSchedule")]
    assert taints("71") == [("efa.aws.com/unhealthy", "DevNodeMissing", "NoSchedule")]
    assert taints("4f") == []
    assert devices["efa-0000-60-00-0"].attributes["rdmaDevice"] == "rdmap96s0", "identity kept while gone"
    scan = profile.scan(paths, "1.2.3")
    evicting = {d.name: d for d in tainted(DRIVER, scan.devices, scan.health, "NoExecute")}
    assert [(t.key, t.value, t.effect) for t in evicting["efa-0000-50-00-0"].taints] == [
        ("efa.aws.com/unhealthy", "PortDown", "NoExecute")], "the operator's choice of effect"
    health = profile.scan(paths, "1.2.3").health
    assert "port is DOWN, not ACTIVE" in health["efa-0000-50-00-0"].message
    fake.set_port_state("rdmap80s0", "ACTIVE")
    fake.restore_efa("rdmap96s0")
    assert not published(paths, profile)["efa-0000-60-00-0"].taints


def test_the_device_plugin_sees_the_same_health(tmp_path: Path) -> None:
    fake, paths = host(tmp_path, "p5.48xlarge")
    profile, policy = EfaProfile(), EfaPolicy(paths)
    profile.scan(paths, "1.2.3")
    policy.rediscover()
    fake.set_port_state("rdmap80s0", "DOWN")
    fake.remove_efa("rdmap96s0")
    policy.rediscover()
    dra = {name: h.healthy for name, h in profile.scan(paths, "1.2.3").health.items()}
    plugin = {"efa-" + d.id.replace(":", "-").replace(".", "-"): d.healthy for d in policy.devices()}
    assert dra == plugin and sum(not h for h in dra.values()) == 2


def test_both_daemons_poll_each_present_efas_port_state(tmp_path: Path) -> None:
    fake, paths = host(tmp_path, "p5.48xlarge")
    profile, plugin = EfaProfile(), DevicePluginService(PLUGIN, paths)
    plugin.profile = EfaPolicy(paths)

    def polled() -> list[Path]:
        files = profile.scanner.health_files(paths, profile.scan(paths, "1.2.3").inventory)
        assert files == plugin.look()[1], "the device plugin and the DRA driver poll the same files"
        return files

    files = polled()
    assert len(files) == 32, "p5.48xlarge: 32 EFAs, one port each"
    assert {(f.parent.name, f.name, f.read_text()) for f in files} == {("1", "state", "4: ACTIVE\n")}
    fake.remove_efa("rdmap96s0")
    files = polled()
    assert len(files) == 31 and not any("rdmap96s0" in str(f) for f in files), "nothing to poll on a vanished EFA"


@pytest.mark.parametrize(("params", "pattern"), [
    ({"apiVersion": "efa.aws.com/v1", "kind": "EfaConfig", "rdmaCm": False}, "unknown field 'rdmaCm'"),
    ({"apiVersion": "efa.aws.com/v1", "kind": "NeuronConfig"}, "kind 'NeuronConfig' is not supported"),
    ({"apiVersion": "efa.aws.com/v2", "kind": "EfaConfig"}, "apiVersion 'efa.aws.com/v2' is not supported"),
    ('{"apiVersion": "efa.aws.com/v1", "kind": "EfaConfig"}', "must be an object, got a string"),
])
def test_config_is_strict(params: Any, pattern: str) -> None:
    assert EfaProfile().decode_config({"apiVersion": "efa.aws.com/v1", "kind": "EfaConfig"}, "c") == EfaConfig()
    with pytest.raises(ConfigError, match=pattern):
        EfaProfile().decode_config(params, "config[0]")


# -- prepare through the core handler --------------------------------------------------------------------------------
def test_prepare_writes_uverbs_and_rdma_cm(tmp_path: Path) -> None:
    fake, paths = host(tmp_path, "p5.48xlarge")
    rig = DriverRig(paths, EfaProfile())
    cdi = rig.cdi
    # one PCIe root of p5: rdmap79s0..rdmap82s0 = buses 4f..52 (efa.md 2.2)
    names = [f"efa-0000-{bus}-00-0" for bus in ("4f", "50", "51", "52")]
    ref = rig.add("c-u-1", names, uid="u-1", request="efa", params=[{"apiVersion": "efa.aws.com/v1",
                                                                    "kind": "EfaConfig"}])
    devices = rig.prepare_one(ref)
    assert [d.device for d in devices] == names
    assert devices[0].cdi_device_ids == ("k8s.efa.aws.com/claim=u-1-efa-0000-4f-00-0",
                                         "k8s.efa.aws.com/claim=u-1-request-efa")
    assert devices[1].cdi_device_ids == ("k8s.efa.aws.com/claim=u-1-efa-0000-50-00-0",)
    assert_cdi_accepts(paths.cdi_root, [i for d in devices for i in d.cdi_device_ids])
    spec = json.loads(cdi.spec_path("u-1").read_text())
    assert spec["kind"] == "k8s.efa.aws.com/claim"
    nodes = {d["name"]: d["containerEdits"]["deviceNodes"] for d in spec["devices"]}
    assert nodes["u-1-request-efa"] == [{"path": "/dev/infiniband/rdma_cm", "permissions": "rw"}]
    first = nodes["u-1-efa-0000-4f-00-0"]
    uverbs = fake.uverbs_of("rdmap79s0")
    minor = 192 + int(uverbs.removeprefix("uverbs"))  # ib_uverbs: major 231, minors from 192
    assert first == [{"path": f"/dev/infiniband/{uverbs}", "permissions": "rw", "type": "c", "major": 231,
                      "minor": minor}]
    assert rig.prepare_one(ref) == devices, "idempotent"
    other = rig.add("c-u-2", [names[3]], uid="u-2", request="efa")
    with pytest.raises(ClaimError, match="efa-0000-52-00-0 is already prepared for claim ns/c-u-1"):
        rig.prepare_one(other)
    rig.unprepare_one(ref)
    rig.unprepare_one(ref)
    assert not cdi.exists("u-1") and rig.prepare_one(other)[0].device == names[3]


def test_prepare_refuses_unknown_and_vanished_devices(tmp_path: Path) -> None:
    fake, paths = host(tmp_path, "p5.48xlarge")
    profile = EfaProfile()
    profile.scan(paths, "1.2.3")
    fake.remove_efa("rdmap79s0")
    inv = profile.scan(paths, "1.2.3").inventory
    with pytest.raises(ClaimError, match=r"efa-0000-4f-00-0 \(rdmap79s0, request r\) cannot be used.*gone"):
        profile.container_edits(inv, "r", ["efa-0000-4f-00-0"], EfaConfig())
    with pytest.raises(ClaimError, match="efa-0000-ff-00-0 .*is not an EFA of this node"):
        profile.container_edits(inv, "r", ["efa-0000-ff-00-0"], EfaConfig())


# -- coexistence -----------------------------------------------------------------------------------------------------
def test_the_device_plugin_stands_down_for_the_dra_driver_never_the_reverse(short_tmp: Path) -> None:
    _, paths = host(short_tmp, "p4d.24xlarge")  # short: unix socket paths are bound below
    profile, policy = EfaProfile(), EfaPolicy(paths)
    plugins, registry = paths.device_plugins_dir, paths.plugins_registry_dir
    plugins.mkdir(parents=True)
    registry.mkdir(parents=True)
    (plugins / "aws-efa-device-plugin.sock").write_text("")  # a stale regular file is no running plugin
    (registry / ".efa.aws.com-reg.sock").write_text("")  # nor a hidden name
    (registry / "efa.aws.com-reg.sock").write_text("")  # one rule both ways: a regular file is no driver either
    assert profile.scanner.coexistence.dra_sharing_note(paths) is None and policy.advertise_blocked() is None
    (plugins / "aws-efa-device-plugin.sock").unlink()
    (registry / "efa.aws.com-reg.sock").unlink()
    socks = [socket.socket(socket.AF_UNIX), socket.socket(socket.AF_UNIX)]
    try:
        socks[0].bind(str(plugins / "aws-efa-device-plugin.sock"))
        assert "EFA device plugin is also on this node" in str(profile.scanner.coexistence.dra_sharing_note(paths))
        assert policy.advertise_blocked() is None
        socks[1].bind(str(registry / "efa.aws.com-0b7c-reg.sock"))  # a rolling update's pod UID
        assert "EFA DRA driver (efa.aws.com) serves this node" in str(policy.advertise_blocked())
        # the other accelerators' sockets do not count
        assert NeuronProfile().scanner.coexistence.dra_sharing_note(paths) is None
    finally:
        for s in socks:
            s.close()


def test_slices_cli(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    host(tmp_path, "trn1.32xlarge")
    assert main(["slices", "--host-root", str(tmp_path / "host"), "--node-name", "n1", "--node-uid", "u7"]) == 0
    [obj] = json.loads(capsys.readouterr().out)
    assert obj["metadata"]["generateName"] == "n1-efa.aws.com-"
    assert obj["metadata"]["ownerReferences"][0]["uid"] == "u7"
    assert obj["spec"]["driver"] == DRIVER and obj["spec"]["pool"]["name"] == "n1"
    assert len(obj["spec"]["devices"]) == 8
    copy_host(tmp_path / "empty", "c5.large")
    assert main(["slices", "--host-root", str(tmp_path / "empty"), "--node-name", "n1"]) == 0
    assert json.loads(capsys.readouterr().out) == []
