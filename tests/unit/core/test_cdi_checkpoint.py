"""The generic CDI spec writer and the prepared-claims checkpoint."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from accel_core.dra.cdi import CDI_VERSION, CdiError, CdiSpecWriter
from accel_core.dra.checkpoint import Checkpoint, CheckpointError, CheckpointFile, read_boot_id
from accel_core.dra.prepared import PreparedClaim
from accel_core.edits import ContainerEdits, DeviceNode, Mount


def test_spec_naming_content_and_removal(tmp_path: Path) -> None:
    writer = CdiSpecWriter(tmp_path / "cdi", "k8s.example.com", "claim")
    edits = ContainerEdits(device_nodes=(DeviceNode("/dev/x0", host_path="/host/dev/x0", major=10, minor=3),),
                           env=(("A", "1"),), mounts=(Mount("/opt/h", "/opt/c"),))
    ids = writer.write("0a1b-uid", [("0a1b-uid-x0", edits)], common=ContainerEdits(env=(("NODE", "n1"),)))
    assert ids == ["k8s.example.com/claim=0a1b-uid-x0"]
    path = tmp_path / "cdi" / "k8s.example.com-claim_0a1b-uid.json"
    spec = json.loads(path.read_text())
    assert spec["cdiVersion"] == CDI_VERSION and spec["kind"] == "k8s.example.com/claim"
    node = spec["devices"][0]["containerEdits"]["deviceNodes"][0]
    assert node == {"path": "/dev/x0", "hostPath": "/host/dev/x0", "permissions": "rw", "type": "c", "major": 10,
                    "minor": 3}
    assert spec["devices"][0]["containerEdits"]["env"] == ["A=1"]
    assert spec["containerEdits"]["env"] == ["NODE=n1"]
    assert writer.spec_ids() == ["0a1b-uid"] and writer.exists("0a1b-uid")
    assert not list(path.parent.glob(".tmp-*")), "no temp file is left behind"
    assert writer.remove("0a1b-uid") and not writer.remove("0a1b-uid"), "remove is idempotent"


def test_spec_errors_name_the_file(tmp_path: Path) -> None:
    writer = CdiSpecWriter(tmp_path, "k8s.example.com", "claim")
    with pytest.raises(CdiError, match="k8s.example.com-claim_u1.json"):
        writer.write("u1", [("bad name!", ContainerEdits())])
    with pytest.raises(CdiError, match="no devices"):
        writer.write("u1", [])
    (tmp_path / "k8s.example.com-claim_u2.json").write_text("{not json")
    with pytest.raises(CdiError, match="unreadable CDI spec .*u2.json"):
        writer.read("u2")
    assert writer.read("missing") is None


def test_checkpoint_round_trip_and_tamper_detection(tmp_path: Path) -> None:
    file = CheckpointFile(tmp_path / "checkpoint.json")
    assert file.load().claims == {}, "no file yet means an empty checkpoint"
    file.save(Checkpoint(boot_id="b1", claims={"u1": {"state": "PrepareCompleted", "devices": [1, 2]}}))
    loaded = file.load()
    assert loaded.boot_id == "b1" and loaded.claims["u1"]["devices"] == [1, 2]
    doc = json.loads(file.path.read_text())
    doc["body"]["claims"]["u1"]["devices"] = [3]
    file.path.write_text(json.dumps(doc))
    with pytest.raises(CheckpointError, match="checksum"):
        file.load()
    file.path.write_text("garbage")
    with pytest.raises(CheckpointError, match=str(file.path)):
        file.load()


def test_boot_id_under_host_root(tmp_path: Path) -> None:
    assert read_boot_id(tmp_path) == ""
    (tmp_path / "proc/sys/kernel/random").mkdir(parents=True)
    (tmp_path / "proc/sys/kernel/random/boot_id").write_text("abc-123\n")
    assert read_boot_id(tmp_path) == "abc-123"


V1_ENTRY = {  # a claim entry as v1 checkpoints on nodes hold it (written by every release so far)
    "state": "PrepareCompleted", "namespace": "ml", "name": "train", "pool": "node-a",
    "requests": [{"name": "chips", "devices": ["neuron-0"],
                  "deviceEdits": {"neuron-0": {"deviceNodes": [{"path": "/dev/neuron0", "permissions": "rw"}]}},
                  "edits": {"env": [["NEURON_RT_VISIBLE_CORES", "0-7"]]}}],
}


def test_a_v1_entry_loads_and_writes_back_equal() -> None:
    claim = PreparedClaim.from_json("uid-1", V1_ENTRY)
    assert claim.devices == ("neuron-0",) and claim.requests[0].edits.env == (("NEURON_RT_VISIBLE_CORES", "0-7"),)
    again = json.loads(json.dumps(claim.to_json()))
    assert PreparedClaim.from_json("uid-1", again) == claim


@pytest.mark.parametrize("change, field", [
    ({"state": "Prepared"}, "$.state"),
    ({"name": 7}, "$.name"),  # no coercion: a number is not a name
    ({"extra": True}, "extra"),
    ({"requests": [{"name": "chips", "devices": "neuron-0"}]}, "$.requests[0].devices"),
    ({"requests": [{"name": "chips", "devices": ["neuron-0"], "edits": {"env": [["A"]]}}]}, "$.requests[0].edits.env"),
])
def test_a_malformed_entry_is_refused_naming_the_claim_and_field(change: dict[str, object], field: str) -> None:
    with pytest.raises(ValueError) as err:
        PreparedClaim.from_json("uid-1", {**V1_ENTRY, **change})
    assert "uid-1" in str(err.value) and field in str(err.value)
