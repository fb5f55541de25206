"""The checkpoint's journal: a change costs one record written in place, a restarted reader (or another process)
finds every change that was made durable, a torn last record is dropped, damage before intact records is refused,
and records of an earlier journal never count again."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from accel_core.dra import checkpoint
from accel_core.dra.checkpoint import JOURNAL_BYTES, Checkpoint, CheckpointError, CheckpointFile


def entry(device: int) -> dict[str, Any]:
    return {"state": "PrepareCompleted", "devices": [device]}


def fresh(path: Path) -> dict[str, Any]:
    """What a restarted driver reads."""
    return CheckpointFile(path).load().claims


def writer(path: Path, claims: dict[str, Any] | None = None) -> CheckpointFile:
    file = CheckpointFile(path)
    file.load()
    file.save(Checkpoint("boot-1", dict(claims or {})))
    return file


def checkpoint_id(path: Path) -> str:
    return str(json.loads(path.read_text())["body"]["journal"])


def test_a_change_is_one_record_in_place_and_a_restart_finds_it(tmp_path: Path) -> None:
    path = tmp_path / "checkpoint.json"
    file = writer(path, {"u0": entry(0)})
    snapshot = path.read_bytes()
    inode = os.stat(file.journal_path).st_ino
    file.record({"u1": entry(1)}, (), lambda: pytest.fail("the journal has room: no snapshot"))
    file.record({}, ["u0"], lambda: pytest.fail("the journal has room: no snapshot"))
    assert path.read_bytes() == snapshot, "the snapshot is not rewritten for a change"
    assert os.stat(file.journal_path).st_ino == inode and os.path.getsize(file.journal_path) == JOURNAL_BYTES
    assert fresh(path) == {"u1": entry(1)}
    assert CheckpointFile(path).load().boot_id == "boot-1"


def test_a_record_is_json_a_tab_and_its_sha256(tmp_path: Path) -> None:
    path = tmp_path / "checkpoint.json"
    file = writer(path)
    file.record({"u1": entry(1)}, (), lambda: pytest.fail("no snapshot"))
    line = file.journal_path.read_bytes().split(b"\n", 1)[0]
    body, digest = line.split(b"\t")
    assert digest == hashlib.sha256(body).hexdigest().encode()
    assert b'"put":{"u1":{"state":"PrepareCompleted","devices":[1]}}' in body


def test_a_torn_last_record_is_dropped(tmp_path: Path) -> None:
    path = tmp_path / "checkpoint.json"
    file = writer(path)
    file.record({"u1": entry(1)}, (), lambda: pytest.fail("no snapshot"))
    first_end = file.journal_path.read_bytes().index(b"\n") + 1
    file.record({"u2": entry(2)}, (), lambda: pytest.fail("no snapshot"))
    data = bytearray(file.journal_path.read_bytes())
    second_end = data.index(b"\n", first_end) + 1
    data[second_end - 20: second_end] = bytes(20)  # a power loss in the middle of the second record
    file.journal_path.write_bytes(bytes(data))
    assert fresh(path) == {"u1": entry(1)}


def test_damage_before_intact_records_is_refused_naming_the_journal(tmp_path: Path) -> None:
    path = tmp_path / "checkpoint.json"
    file = writer(path)
    for i in range(3):
        file.record({f"u{i}": entry(i)}, (), lambda: pytest.fail("no snapshot"))
    data = bytearray(file.journal_path.read_bytes())
    data[5] ^= 0x01  # one flipped bit in the first record; the second and third are intact
    file.journal_path.write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match=r"checkpoint\.journal is damaged before its record 2"):
        CheckpointFile(path).load()


def test_a_checksummed_line_that_is_no_record_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "checkpoint.json"
    writer(path)
    journal = checkpoint_id(path)
    body = b'{"journal":"' + journal.encode() + b'","seq":"one"}'
    line = body + b"\t" + hashlib.sha256(body).hexdigest().encode() + b"\n"
    (tmp_path / "checkpoint.journal").write_bytes(line + bytes(JOURNAL_BYTES - len(line)))
    with pytest.raises(CheckpointError, match=r"checkpoint\.journal holds a record that is not a checkpoint change"):
        CheckpointFile(path).load()


def test_records_of_an_earlier_journal_never_count_again(tmp_path: Path) -> None:
    path = tmp_path / "checkpoint.json"
    file = writer(path)
    file.record({"u1": entry(1)}, (), lambda: pytest.fail("no snapshot"))
    file.record({}, ["u1"], lambda: pytest.fail("no snapshot"))
    file.save(Checkpoint("boot-1", {}))  # a new snapshot: a new journal, written from the file's start
    file.record({"u1": entry(1)}, (), lambda: pytest.fail("no snapshot"))
    # The new first record is exactly as long as the old one, so the old second record ("delete u1", number 2)
    # follows it on a line of its own, intact: only its journal ID tells it apart.
    assert fresh(path) == {"u1": entry(1)}


def test_a_full_journal_writes_a_snapshot_instead(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "checkpoint.json"
    file = writer(path)
    monkeypatch.setattr(checkpoint, "JOURNAL_BYTES", 300)
    snapshots = []
    state: dict[str, Any] = {}
    for i in range(6):
        state[f"u{i}"] = entry(i)
        file.record({f"u{i}": entry(i)}, (), lambda: snapshots.append(1) or Checkpoint("boot-1", dict(state)))
    assert snapshots, "a record that does not fit goes into a snapshot"
    assert fresh(path) == state


@pytest.mark.parametrize("planted", ["fifo", "directory", "symlink"])
def test_a_journal_that_is_no_regular_file_is_refused(tmp_path: Path, planted: str) -> None:
    path = tmp_path / "checkpoint.json"
    writer(path)
    journal = tmp_path / "checkpoint.journal"
    journal.unlink()
    if planted == "fifo":
        os.mkfifo(journal)
    elif planted == "directory":
        journal.mkdir()
    else:
        (tmp_path / "elsewhere").write_bytes(bytes(JOURNAL_BYTES))
        journal.symlink_to(tmp_path / "elsewhere")
    with pytest.raises(CheckpointError, match=r"checkpoint\.journal"):
        CheckpointFile(path).load()


def test_a_missing_journal_means_the_snapshot_alone_and_the_next_change_makes_one(tmp_path: Path) -> None:
    path = tmp_path / "checkpoint.json"
    writer(path, {"u0": entry(0)})
    (tmp_path / "checkpoint.journal").unlink()
    file = CheckpointFile(path)
    assert file.load().claims == {"u0": entry(0)}
    file.record({"u1": entry(1)}, (), lambda: Checkpoint("boot-1", {"u0": entry(0), "u1": entry(1)}))
    assert os.path.getsize(tmp_path / "checkpoint.journal") == JOURNAL_BYTES
    assert fresh(path) == {"u0": entry(0), "u1": entry(1)}


def test_another_process_sees_each_change_and_each_new_snapshot(tmp_path: Path) -> None:
    path = tmp_path / "checkpoint.json"
    a = writer(path)
    b = CheckpointFile(path)
    b.load()
    assert b.refresh() is None, "nothing changed"
    a.record({"u1": entry(1)}, (), lambda: pytest.fail("no snapshot"))
    seen = b.refresh()
    assert seen is not None and seen.claims == {"u1": entry(1)}
    b.record({"u2": entry(2)}, (), lambda: pytest.fail("no snapshot"))
    seen = a.refresh()
    assert seen is not None and seen.claims == {"u1": entry(1), "u2": entry(2)}
    a.save(Checkpoint("boot-1", {"u2": entry(2)}))
    seen = b.refresh()
    assert seen is not None and seen.claims == {"u2": entry(2)}, "a new snapshot is read whole"
    b.record({"u3": entry(3)}, (), lambda: pytest.fail("no snapshot"))
    assert a.refresh() is not None and fresh(path) == {"u2": entry(2), "u3": entry(3)}


def test_a_record_longer_than_one_refresh_read_is_seen(tmp_path: Path) -> None:
    path = tmp_path / "checkpoint.json"
    a = writer(path)
    b = CheckpointFile(path)
    b.load()
    big = {f"u{i}": entry(i) for i in range(400)}  # ~20 KiB in one record
    a.record(big, (), lambda: pytest.fail("no snapshot"))
    seen = b.refresh()
    assert seen is not None and seen.claims == big


OPS = st.lists(st.tuples(st.sampled_from(["put", "delete", "snapshot"]), st.integers(0, 5)), max_size=40)


@settings(max_examples=60, deadline=None)
@given(ops=OPS, room=st.integers(120, 2000))
def test_any_sequence_of_changes_reads_back_exactly(tmp_path_factory: pytest.TempPathFactory, ops: list[Any],
                                                    room: int) -> None:
    """Property: after any sequence of puts, deletes and snapshots (and a journal of any size, so some changes
    overflow into snapshots), a restarted reader and a second process both hold exactly the entries a plain dict
    holds after the same changes."""
    path = tmp_path_factory.mktemp("journal") / "checkpoint.json"
    saved = checkpoint.JOURNAL_BYTES
    checkpoint.JOURNAL_BYTES = room  # type: ignore[misc]
    try:
        file = writer(path)
        other = CheckpointFile(path)
        other.load()
        model: dict[str, Any] = {}
        for op, n in ops:
            uid = f"u{n}"
            if op == "put":
                model[uid] = entry(n)
                file.record({uid: entry(n)}, (), lambda: Checkpoint("boot-1", dict(model)))
            elif op == "delete":
                model.pop(uid, None)
                file.record({}, [uid], lambda: Checkpoint("boot-1", dict(model)))
            else:
                file.save(Checkpoint("boot-1", dict(model)))
        assert fresh(path) == model
        other.refresh()
        assert other.current.claims == model
    finally:
        checkpoint.JOURNAL_BYTES = saved  # type: ignore[misc]
