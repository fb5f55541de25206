"""Device metadata on the production prepare path (the plugin reads the claim, the driver prepares it): each request
gets its file and the mount of it in its own CDI entry; unprepare and the next start's orphan pruning remove files;
a refused claim writes nothing it keeps. Facts: p5.48xlarge EFA names and layout (efa.md 2.2), trn2 LNC 2 (4 logical
cores per Trainium2 device), the helper's paths (k8s.io/dynamic-resource-allocation v0.37.2 api/metadata/doc.go)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from drarig import DriverRig, host_paths
from hostcache import shared_host

from accel_core.dra.types import ClaimRef
from efa_plugin.dra.profile import EfaProfile
from neuron_dra.dra.profile import NeuronProfile

BASE = "/var/run/kubernetes.io/dra-device-attributes"
P5_EFAS = [f"efa-0000-{bus}-00-0" for bus in ("4f", "50")]  # rdmap79s0, rdmap80s0 of one p5 PCIe root


def spec_mounts(rig: DriverRig, uid: str) -> list[dict[str, object]]:
    spec = json.loads(next(rig.paths.cdi_root.glob(f"*{uid}*.json")).read_text())
    return [m for d in spec["devices"] for m in d["containerEdits"].get("mounts", [])]


def first_object(path: Path) -> dict[str, object]:
    return json.JSONDecoder().raw_decode(path.read_text())[0]  # type: ignore[no-any-return]


def test_an_efa_request_gets_its_file_and_one_mount(tmp_path: Path) -> None:
    rig = DriverRig(host_paths(tmp_path, shared_host("p5.48xlarge").root), EfaProfile(), metadata=True)
    ref = rig.add("fabric", P5_EFAS, uid="0b4a3f33-0bd2-4a5d-9c3f-8a1e25d0a001", request="nic")
    rig.prepare_one(ref)
    (mount,) = spec_mounts(rig, ref.uid)  # one per request, not one per device
    assert mount["containerPath"] == f"{BASE}/resourceclaims/fabric/nic/efa.aws.com-metadata.json"
    assert "ro" in mount["options"] and "bind" in mount["options"]  # type: ignore[operator]
    doc = first_object(Path(str(mount["hostPath"])))
    devices = doc["requests"][0]["devices"]  # type: ignore[index]
    assert [d["name"] for d in devices] == P5_EFAS
    first = devices[0]["attributes"]
    assert first["rdmaDevice"] == {"string": "rdmap79s0"}
    assert first["uverbsDevice"]["string"].startswith("/dev/infiniband/uverbs")
    assert first["instanceType"] == {"string": "p5.48xlarge"}
    rig.unprepare_one(ref)
    assert not Path(str(mount["hostPath"])).exists()


def test_a_neuron_claim_says_what_the_container_sees(tmp_path: Path) -> None:
    rig = DriverRig(host_paths(tmp_path, shared_host("trn2.48xlarge").root), NeuronProfile(), metadata=True)
    ref = rig.add("pair", ["neuron-device-5", "neuron-device-2"], uid="0b4a3f33-0bd2-4a5d-9c3f-8a1e25d0a002",
                  request="neurons")
    rig.prepare_one(ref)
    (mount,) = spec_mounts(rig, ref.uid)
    devices = {d["name"]: d["attributes"] for d in
               first_object(Path(str(mount["hostPath"])))["requests"][0]["devices"]}  # type: ignore[index]
    # NEURON_RT_VISIBLE_CORES numbers the container's devices from 0 in index order, 4 logical cores each (LNC 2)
    assert devices["neuron-device-2"]["visibleCores"] == {"string": "0-3"}
    assert devices["neuron-device-5"]["visibleCores"] == {"string": "4-7"}
    assert devices["neuron-device-5"]["logicalNeuronCore"] == {"int": 2}
    assert devices["neuron-device-5"]["deviceId"] == {"int": 5}  # the published attribute


def test_orphans_go_at_the_next_start_and_kept_claims_stay(tmp_path: Path) -> None:
    rig = DriverRig(host_paths(tmp_path, shared_host("p5.48xlarge").root), EfaProfile(), metadata=True)
    kept = rig.add("kept", P5_EFAS[:1], uid="0b4a3f33-0bd2-4a5d-9c3f-8a1e25d0a003")
    rig.prepare_one(kept)
    root = rig.checkpoint.parent / "dra-device-metadata"
    (root / "ns_killed-mid-prepare" / "r").mkdir(parents=True)
    (root / "ns_killed-mid-prepare" / "r" / "metadata.json").write_text("{}")
    rig.restart()
    assert sorted(p.name for p in root.iterdir()) == ["ns_kept"]


def test_a_hostile_claim_name_in_unprepare_touches_no_path(tmp_path: Path) -> None:
    rig = DriverRig(host_paths(tmp_path, shared_host("p5.48xlarge").root), EfaProfile(), metadata=True)
    victim = tmp_path / "victim"
    victim.mkdir()
    errors = rig.unprepare(ClaimRef("..", "0b4a3f33-0bd2-4a5d-9c3f-8a1e25d0a004", "../../../victim"))
    assert errors == {"0b4a3f33-0bd2-4a5d-9c3f-8a1e25d0a004": None} and victim.exists()


def test_a_claim_whose_unprepare_cannot_be_recorded_keeps_its_file(tmp_path: Path, monkeypatch: Any) -> None:
    """The checkpoint write fails: the claim stays prepared (entry and CDI spec put back), so the file its spec
    mounts stays too; the kubelet's retry removes it."""
    rig = DriverRig(host_paths(tmp_path, shared_host("p5.48xlarge").root), EfaProfile(), metadata=True)
    ref = rig.add("fabric", P5_EFAS, uid="0b4a3f33-0bd2-4a5d-9c3f-8a1e25d0a005", request="nic")
    rig.prepare_one(ref)
    (mount,) = spec_mounts(rig, ref.uid)

    def full(uids: object) -> set[str]:
        raise OSError(28, "No space left on device")

    with monkeypatch.context() as m:
        m.setattr(rig.store, "remove_many", full)
        assert rig.unprepare(ref)[ref.uid] is not None
    assert Path(str(mount["hostPath"])).exists()
    rig.unprepare_one(ref)
    assert not Path(str(mount["hostPath"])).exists()


def test_a_claim_recreated_under_its_name_keeps_its_file_from_the_old_ones_unprepare(tmp_path: Path) -> None:
    """Files are named by namespace and claim name, entries by UID. A claim force-deleted and created again under the
    same name (a new UID) while the old one is still prepared: the new one's prepare leaves the old one's containers
    the file they mount (a new file, not the old one rewritten), and the old one's unprepare leaves the new one's
    file alone."""
    rig = DriverRig(host_paths(tmp_path, shared_host("p5.48xlarge").root), EfaProfile(), metadata=True)
    old = rig.add("fabric", P5_EFAS[:1], uid="0b4a3f33-0bd2-4a5d-9c3f-8a1e25d0a0a1", request="nic")
    rig.prepare_one(old)
    (mount,) = spec_mounts(rig, old.uid)
    path = Path(str(mount["hostPath"]))
    with path.open() as mounted:  # what the old claim's containers have bind-mounted
        new = rig.add("fabric", P5_EFAS[1:], uid="0b4a3f33-0bd2-4a5d-9c3f-8a1e25d0a0a2", request="nic")
        rig.prepare_one(new)
        assert P5_EFAS[0] in mounted.read(), "the old claim's containers saw the new claim's file"
    rig.unprepare_one(old)
    assert [d["name"] for d in first_object(path)["requests"][0]["devices"]] == P5_EFAS[1:]  # type: ignore[index]
    rig.unprepare_one(new)
    assert not path.exists()
