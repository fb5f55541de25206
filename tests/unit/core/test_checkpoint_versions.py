"""Checkpoint versions: the format fields, both compatibility rules, and the N-1 -> N -> N-1 path with the previous
release's own code, taken from git (commit 64528e2, the driver before round 3) and run in a subprocess.

What a ``helm rollback`` does to a node is what these tests do to the files: the old driver starts on the new
driver's checkpoint (snapshot and journal, with workload and admin-access claims prepared), carries on, and the
new driver starts again on what the old one left."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from accel_core.dra.checkpoint import FORMAT, Checkpoint, CheckpointFile
from accel_core.dra.prepared import PreparedClaim, entry_format
from accel_core.dra.store import ClaimStore

REPO = Path(__file__).resolve().parents[3]
#: The previous release: the last commit before this round's work (reads entry format 2).
PREVIOUS = "64528e2"
#: The last driver before admin access (reads entry format 1 only).
FORMAT_1 = "ad84064~1"
BOOT = "boot-1"


def entry(name: str, device: str, *, admin: bool = False) -> dict[str, Any]:
    request: dict[str, Any] = {"name": "all" if admin else "work", "devices": [device],
                               "deviceEdits": {device: {"deviceNodes": [{"path": f"/dev/{device}"}]}}}
    if admin:
        request["adminAccess"] = True
    return {"state": "PrepareCompleted", "namespace": "ns", "name": name, "pool": "node-a", "requests": [request]}


def claim(name: str, device: str, *, admin: bool = False) -> PreparedClaim:
    return PreparedClaim.from_json(f"uid-{name}", entry(name, device, admin=admin))


def extract(factory: pytest.TempPathFactory, commit: str) -> Path:
    """accel_core as it was at ``commit``, extracted from git."""
    root = factory.mktemp("previous")
    archive = subprocess.run(["git", "-C", str(REPO), "archive", commit, "accel_core"], capture_output=True,
                             check=False)
    if archive.returncode != 0:
        pytest.skip(f"commit {commit} is not in this clone: {archive.stderr.decode().strip()}")
    subprocess.run(["tar", "-x", "-C", str(root)], input=archive.stdout, check=True)
    return root


@pytest.fixture(scope="module")
def previous(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return extract(tmp_path_factory, PREVIOUS)


@pytest.fixture(scope="module")
def format_1(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return extract(tmp_path_factory, FORMAT_1)


#: The previous release's driver side: load the checkpoint, apply the changes, optionally stop cleanly, and print
#: the claims it holds (as entries) and its error.
OLD_DRIVER = """
import json, sys
from pathlib import Path
from accel_core.dra.prepared import PreparedClaim
from accel_core.dra.store import ClaimStore
path, boot, put, remove, stop = sys.argv[1], sys.argv[2], json.loads(sys.argv[3]), json.loads(sys.argv[4]), sys.argv[5]
store = ClaimStore(Path(path), boot)
store.load()
if put:
    store.put_many([PreparedClaim.from_json(uid, e) for uid, e in put.items()])
if remove:
    store.remove_many(remove)
if stop == "stop":
    store.compact()
held = {c.uid: list(getattr(c, "held_devices", c.devices)) for c in store.claims()}
print(json.dumps({"error": store.error, "claims": {c.uid: c.to_json() for c in store.claims()}, "held": held}))
"""


def old_driver(previous: Path, path: Path, put: dict[str, Any] | None = None, remove: list[str] | None = None,
               stop: bool = False) -> dict[str, Any]:
    env = {**os.environ, "PYTHONPATH": str(previous)}
    done = subprocess.run([sys.executable, "-c", OLD_DRIVER, str(path), BOOT, json.dumps(put or {}),
                           json.dumps(remove or []), "stop" if stop else "run"],
                          capture_output=True, text=True, env=env, cwd=previous, check=False, timeout=60)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "Traceback" not in done.stderr
    out: dict[str, Any] = json.loads(done.stdout)
    return out


def as_json(*claims: PreparedClaim) -> dict[str, Any]:
    """The claims' checkpoint entries as JSON gives them back."""
    out: dict[str, Any] = json.loads(json.dumps({c.uid: c.to_json() for c in claims}))
    return out


def new_driver(path: Path) -> ClaimStore:
    store = ClaimStore(path, BOOT)
    store.load()
    return store


def test_the_previous_release_is_the_code_from_git(previous: Path) -> None:
    old = (previous / "accel_core/dra/checkpoint.py").read_text()
    assert "formatVersion" not in old and 'CHECKPOINT_VERSION = "v1"' in old


@pytest.mark.parametrize("stop", [True, False], ids=["clean-stop", "killed-with-a-journal"])
def test_n_minus_1_to_n_to_n_minus_1_with_admin_access_claims(tmp_path: Path, previous: Path, stop: bool) -> None:
    path = tmp_path / "checkpoint.json"
    # N-1 prepares a workload and a monitor (admin access) on the same device
    w1, a1 = claim("w1", "neuron-0"), claim("a1", "neuron-0", admin=True)
    first = old_driver(previous, path, put=as_json(w1, a1), stop=stop)
    assert first["error"] is None and first["held"] == {w1.uid: ["neuron-0"], a1.uid: []}

    # upgrade: N reads it all, unprepares the workload, prepares another workload and another monitor
    new = new_driver(path)
    assert new.error is None and {c.uid: c for c in new.claims()} == {w1.uid: w1, a1.uid: a1}
    assert new.holder("neuron-0", other_than="x") == w1
    w2, a2 = claim("w2", "neuron-0"), claim("a2", "neuron-1", admin=True)
    new.remove_many([w1.uid])
    new.put_many([w2])
    new.put_many([a2])
    if stop:
        new.compact()
    new.file.close()
    # helm rollback: N-1 starts on N's files, sees exactly N's claims, and carries on
    seen = old_driver(previous, path)
    assert seen["error"] is None and seen["claims"] == as_json(a1, w2, a2)
    assert seen["held"] == {a1.uid: [], w2.uid: ["neuron-0"], a2.uid: []}
    w3 = claim("w3", "neuron-1")
    back = old_driver(previous, path, put=as_json(w3), remove=[a1.uid], stop=stop)
    assert back["error"] is None and back["claims"] == as_json(w2, a2, w3)

    # and forward again: N reads what N-1 left
    again = new_driver(path)
    assert again.error is None
    assert as_json(*again.claims()) == back["claims"]
    assert again.holder("neuron-1", other_than="x") == claim("w3", "neuron-1")


def test_a_format_1_driver_reads_n_without_monitors_and_names_a_monitor_it_cannot_read(
        tmp_path: Path, format_1: Path) -> None:
    path = tmp_path / "checkpoint.json"
    new = new_driver(path)
    new.put_many([claim("w1", "neuron-0")])
    new.file.close()
    old = old_driver(format_1, path, put=as_json(claim("w2", "neuron-1")))
    assert old["error"] is None and set(old["claims"]) == {"uid-w1", "uid-w2"}
    new = new_driver(path)
    new.put_many([claim("a1", "neuron-0", admin=True)])
    new.file.close()
    old = old_driver(format_1, path)
    assert old["error"] is not None and "\n" not in old["error"] and "uid-a1" in old["error"]
    assert "adminAccess" in old["error"]
    body = json.loads(path.read_text())["body"]
    assert (body["minReaderVersion"], body["claimFormats"]) == (2, {"uid-a1": 2})  # what the file says of it


def test_n_writes_its_version_and_who_can_read_it(tmp_path: Path) -> None:
    path = tmp_path / "checkpoint.json"
    store = new_driver(path)
    store.put_many([claim("w1", "neuron-0")])
    store.compact()
    body = json.loads(path.read_text())["body"]
    assert (body["version"], body["formatVersion"], body["minReaderVersion"], body["claimFormats"]) == \
        ("v1", FORMAT, 1, {})
    store.put_many([claim("a1", "neuron-0", admin=True)])  # needs more than the snapshot says: a snapshot now
    assert store.file.journaled == 0
    body = json.loads(path.read_text())["body"]
    assert (body["minReaderVersion"], body["claimFormats"]) == (2, {"uid-a1": 2})
    store.put_many([claim("a2", "neuron-1", admin=True)])  # the snapshot already says 2: a journal record
    assert store.file.journaled == 1
    store.remove_many(["uid-a1", "uid-a2"])
    store.compact()
    body = json.loads(path.read_text())["body"]
    assert (body["minReaderVersion"], body["claimFormats"]) == (1, {})  # back to what every driver reads
    store.file.close()
    assert {c.uid for c in new_driver(path).claims()} == {"uid-w1"}


def test_entry_formats() -> None:
    assert entry_format(entry("w", "neuron-0")) == 1
    assert entry_format(entry("a", "neuron-0", admin=True)) == 2
    assert entry_format({"requests": "junk"}) == 1


def newer_file(path: Path, claims: dict[str, dict[str, Any]], formats: dict[str, int], least: int) -> None:
    file = CheckpointFile(path)
    file.save(Checkpoint(BOOT, claims))
    file.close()
    doc = json.loads(path.read_text())
    body = {**doc["body"], "formatVersion": least, "minReaderVersion": least, "claimFormats": formats,
            "somethingNew": {"x": 1}}
    canonical = json.dumps(body, sort_keys=True, separators=(",", ":"))
    import hashlib
    path.write_text(json.dumps({"body": body, "checksum": hashlib.sha256(canonical.encode()).hexdigest()}))


def test_a_checkpoint_of_a_newer_driver_is_refused_in_one_line_naming_its_claims(tmp_path: Path) -> None:
    path = tmp_path / "checkpoint.json"
    future = entry("gpu-share", "neuron-0") | {"shareId": "s1"}  # a field this driver does not know
    newer_file(path, {"uid-old": entry("w1", "neuron-1"), "uid-new": future}, {"uid-new": FORMAT + 1}, FORMAT + 1)
    before = path.read_bytes()
    store = new_driver(path)
    assert store.error is not None and "\n" not in store.error
    assert f"needs a newer driver (entry format {FORMAT + 1}; this driver reads up to {FORMAT})" in store.error
    assert "ns/gpu-share (uid uid-new)" in store.error and "ns/w1" not in store.error  # (the path may hold "gw1")
    store.compact()  # a clean stop writes nothing over it
    store.file.close()
    assert path.read_bytes() == before


def test_unknown_snapshot_fields_of_a_newer_driver_are_ignored_when_it_says_this_driver_reads_it(
        tmp_path: Path) -> None:
    path = tmp_path / "checkpoint.json"
    newer_file(path, {"uid-w1": entry("w1", "neuron-1")}, {}, 1)
    store = new_driver(path)
    assert store.error is None and [c.name for c in store.claims()] == ["w1"]


@pytest.mark.parametrize("field, value", [("minReaderVersion", "2"), ("minReaderVersion", 0),
                                          ("claimFormats", [1]), ("claimFormats", {"u": "2"})])
def test_malformed_version_fields_are_refused_naming_the_file(tmp_path: Path, field: str, value: Any) -> None:
    path = tmp_path / "checkpoint.json"
    newer_file(path, {}, {}, 1)
    doc = json.loads(path.read_text())
    body = {**doc["body"], field: value}
    import hashlib
    canonical = json.dumps(body, sort_keys=True, separators=(",", ":"))
    path.write_text(json.dumps({"body": body, "checksum": hashlib.sha256(canonical.encode()).hexdigest()}))
    store = new_driver(path)
    assert store.error is not None and str(path) in store.error and field in store.error
