"""The checkpoint's journal: a change costs one record written in place, a restarted reader (or another process)
finds every change that was made durable, a torn last record is dropped, damage before intact records is refused,
and records of an earlier journal never count again."""

from __future__ import annotations

import hashlib
import json
import multiprocessing
import os
import signal
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from accel_core import atomic as atomic_module
from accel_core.dra import checkpoint
from accel_core.dra.checkpoint import FILL_LINE, JOURNAL_BYTES, Checkpoint, CheckpointError, CheckpointFile
from accel_core.dra.store import ClaimStore


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
    # a power loss in the middle of the second record: its end never replaced what the file held there (filler)
    data[second_end - 20: second_end] = (FILL_LINE * 2)[second_end % 64 - 20 + 64: second_end % 64 + 64]
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
    (tmp_path / "checkpoint.journal").write_bytes(line + (FILL_LINE * (JOURNAL_BYTES // 64))[len(line):])
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


def _damage(journal: Path, kind: str) -> None:
    """What an operator, a tool or a broken disk did to the journal while the driver was stopped."""
    data = journal.read_bytes()
    after_first = data.index(b"\n") + 1
    if kind == "deleted":
        journal.unlink()
    elif kind == "emptied":
        journal.write_bytes(b"")
    elif kind == "truncated-after-record-1":
        os.truncate(journal, after_first)
    elif kind == "zeroed-tail":  # truncated after record 1, then extended to its size again: zero bytes
        os.truncate(journal, after_first)
        os.truncate(journal, len(data))
    elif kind == "wiped":  # the whole file zeroed in place
        journal.write_bytes(bytes(len(data)))
    else:
        raise AssertionError(kind)


@pytest.mark.parametrize(("kind", "message"), [
    ("deleted", r"journal .*checkpoint\.journal is missing: checkpoint .*checkpoint\.json names journal"),
    ("emptied", r"journal .*checkpoint\.journal is 0 bytes, not 262144"),
    ("truncated-after-record-1", r"journal .*checkpoint\.journal is \d+ bytes, not 262144"),
    ("zeroed-tail", r"journal .*checkpoint\.journal holds zero bytes from offset \d+"),
    ("wiped", r"journal .*checkpoint\.journal holds zero bytes from offset 0"),
])
def test_a_lost_journal_record_is_refused_naming_the_file(tmp_path: Path, kind: str, message: str) -> None:
    """Issue 25 item 2: records lost to a deleted, emptied, truncated or zeroed journal are refused, never read as
    fewer claims (their devices would be handed out again)."""
    path = tmp_path / "checkpoint.json"
    file = writer(path, {"u0": entry(0)})
    for i in (1, 2):
        file.record({f"u{i}": entry(i)}, (), lambda: pytest.fail("the journal has room: no snapshot"))
    file.close()
    _damage(tmp_path / "checkpoint.journal", kind)
    with pytest.raises(CheckpointError, match=message):
        CheckpointFile(path).load()


def test_a_journal_damaged_while_another_process_runs_is_refused_at_its_next_refresh(tmp_path: Path) -> None:
    path = tmp_path / "checkpoint.json"
    a = writer(path)
    a.record({"u1": entry(1)}, (), lambda: pytest.fail("no snapshot"))
    b = CheckpointFile(path)
    b.load()
    a.record({"u2": entry(2)}, (), lambda: pytest.fail("no snapshot"))
    _damage(tmp_path / "checkpoint.journal", "zeroed-tail")
    with pytest.raises(CheckpointError, match=r"checkpoint\.journal holds zero bytes"):
        b.refresh()


def test_a_deleted_snapshot_is_refused_while_its_journal_holds_records(tmp_path: Path) -> None:
    path = tmp_path / "checkpoint.json"
    file = writer(path, {"u0": entry(0)})
    file.record({"u1": entry(1)}, (), lambda: pytest.fail("no snapshot"))
    path.unlink()
    with pytest.raises(CheckpointError, match=r"checkpoint .*checkpoint\.json is missing but journal .* holds"):
        CheckpointFile(path).load()
    (tmp_path / "checkpoint.journal").unlink()  # both moved away: start empty
    assert fresh(path) == {}


def test_the_first_change_writes_the_journal_before_the_snapshot_that_names_it(tmp_path: Path,
                                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """A kill between the two writes must not leave a snapshot naming a journal that is not there (refused)."""
    path = tmp_path / "checkpoint.json"
    order: list[str] = []
    real = checkpoint.atomic_write_text

    def spy(target: Path, text: Any, **kwargs: Any) -> None:
        order.append(Path(target).name)
        real(target, text, **kwargs)

    monkeypatch.setattr(checkpoint, "atomic_write_text", spy)
    monkeypatch.setattr(atomic_module, "atomic_write_text", spy)
    file = CheckpointFile(path)
    file.load()
    file.record({"u1": entry(1)}, (), lambda: Checkpoint("boot-1", {"u1": entry(1)}))
    assert order == ["checkpoint.journal", "checkpoint.json"]
    assert fresh(path) == {"u1": entry(1)}
    assert b"\0" not in (tmp_path / "checkpoint.journal").read_bytes(), "a new journal holds filler, no zero byte"


def legacy_checkpoint(path: Path, claims: dict[str, Any], records: list[dict[str, Any]]) -> None:
    """What the previous version left: a snapshot without journalBytes, a journal of zero bytes with records."""
    journal = "0123456789abcdef"
    body = {"version": "v1", "bootId": "boot-1", "journal": journal, "claims": claims}
    digest = hashlib.sha256(json.dumps(body, sort_keys=True, separators=(",", ":")).encode()).hexdigest()
    path.write_text(json.dumps({"body": body, "checksum": digest}))
    lines = b"".join(checkpoint.encode_record(journal, i + 1, put, ()) for i, put in enumerate(records))
    path.with_suffix(".journal").write_bytes(lines + bytes(JOURNAL_BYTES - len(lines)))


def prepared(device: int) -> dict[str, Any]:
    """An entry as the store keeps it."""
    return {"state": "PrepareCompleted", "namespace": "ns", "name": f"c{device}", "pool": "node-a",
            "requests": [{"name": "r", "devices": [f"neuron-device-{device}"]}]}


def test_an_earlier_versions_checkpoint_is_read_and_converted_at_start(tmp_path: Path) -> None:
    path = tmp_path / "checkpoint.json"
    legacy_checkpoint(path, {"u0": prepared(0)}, [{"u1": prepared(1)}, {"u2": prepared(2)}])
    store = ClaimStore(path, "boot-1")
    assert store.load().claims == 3 and store.error is None
    body = json.loads(path.read_text())["body"]
    assert body["journalBytes"] == JOURNAL_BYTES and sorted(body["claims"]) == ["u0", "u1", "u2"]
    assert b"\0" not in (tmp_path / "checkpoint.journal").read_bytes()
    assert sorted(fresh(path)) == ["u0", "u1", "u2"]
    _damage(tmp_path / "checkpoint.journal", "zeroed-tail")  # from now on, a zeroed tail is seen
    with pytest.raises(CheckpointError, match="holds zero bytes"):
        CheckpointFile(path).load()


def _convert_then_die(path: Path) -> None:
    """In a forked child: the start-up conversion, killed right after the journal was rebuilt."""
    real_replace = os.replace

    def replace(src: Any, dst: Any) -> None:
        real_replace(src, dst)
        if Path(dst).name == "checkpoint.journal":
            os.kill(os.getpid(), signal.SIGKILL)

    os.replace = replace  # type: ignore[assignment]
    ClaimStore(path, "boot-1").load()
    os._exit(3)


def test_a_kill_between_the_journal_rebuild_and_the_snapshot_loses_nothing(tmp_path: Path) -> None:
    path = tmp_path / "checkpoint.json"
    legacy_checkpoint(path, {"u0": prepared(0)}, [{"u1": prepared(1)}, {"u2": prepared(2)}])
    child = multiprocessing.get_context("fork").Process(target=_convert_then_die, args=(path,))
    child.start()
    child.join(60)
    assert child.exitcode == -signal.SIGKILL
    assert "journalBytes" not in json.loads(path.read_text())["body"], "killed before the new snapshot"
    assert fresh(path) == {"u0": prepared(0), "u1": prepared(1), "u2": prepared(2)}


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
