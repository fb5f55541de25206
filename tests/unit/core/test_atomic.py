"""Issue 14 item 4: temp files of atomic writes killed with SIGKILL are removed at the next start, and only those."""

from __future__ import annotations

import fcntl
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from accel_core.atomic import atomic_write_text, clean_stale_temp_files, is_temp_name
from accel_core.dra.checkpoint import Checkpoint, CheckpointFile

VERSIONS = [f"version {i}\n" + "x" * 200_000 + "\n" for i in range(4)]


def temp_files(directory: Path) -> list[str]:
    return sorted(n for n in os.listdir(directory) if n.startswith(".tmp-"))


def writer_loop(path: Path) -> None:
    """Child body: rewrite ``path`` forever (until killed)."""
    i = 0
    while True:
        atomic_write_text(path, VERSIONS[i % len(VERSIONS)])
        i += 1


def test_kill_9_loop_leaves_temp_files_that_the_next_start_removes(tmp_path: Path) -> None:
    target = tmp_path / "checkpoint.json"
    atomic_write_text(target, VERSIONS[0])
    rng = random.Random(14)
    for _ in range(150):
        pid = os.fork()
        if pid == 0:  # child: write until killed
            try:
                writer_loop(target)
            finally:
                os._exit(1)
        time.sleep(rng.uniform(0.0005, 0.01))
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        assert target.read_text() in VERSIONS  # never a torn file
    leftovers = temp_files(tmp_path)
    assert leftovers, "the kills never landed inside a write; the loop proves nothing"
    assert all(is_temp_name(n) for n in leftovers)
    # the next start: a new process's first write into the directory cleans it
    code = ("import sys; from pathlib import Path; from accel_core.atomic import atomic_write_text; "
            "atomic_write_text(Path(sys.argv[1]), 'after restart\\n')")
    subprocess.run([sys.executable, "-c", code, str(target)], check=True, timeout=60)
    assert temp_files(tmp_path) == []
    assert target.read_text() == "after restart\n"


def test_loading_the_checkpoint_at_start_cleans_its_directory(tmp_path: Path) -> None:
    ckpt = CheckpointFile(tmp_path / "checkpoint.json")
    ckpt.save(Checkpoint("boot", {"uid-1": {"state": "completed"}}))
    stale = tmp_path / ".tmp-checkpoint.json-ab12cd_9"
    stale.write_text("half a checkpoint")
    assert ckpt.load().claims == {"uid-1": {"state": "completed"}}
    assert not stale.exists()


def test_only_our_names_and_only_unlocked_regular_files_go(tmp_path: Path) -> None:
    ours = tmp_path / ".tmp-spec.json-k2j4h5g6"
    ours.write_text("stale")
    keep = {
        "spec.json": "a real file",
        ".tmp-spec.json-short": "wrong random part",
        ".tmp-spec.json-ABCDEFGH": "mkstemp never uses upper case",
        "tmp-spec.json-abcdefgh": "no leading dot",
        ".spec.json.tmp-1234": "the fake host's own temp pattern",
        "nvidia.com-gpu_claim.json": "another driver's spec",
    }
    for name, text in keep.items():
        (tmp_path / name).write_text(text)
    other = tmp_path / "elsewhere"
    other.mkdir()
    (tmp_path / ".tmp-link.json-abcdefgh").symlink_to(other / "target")
    (other / "target").write_text("not ours to delete through a link")
    (tmp_path / ".tmp-dir.json-abcdefgh").mkdir()
    os.mkfifo(tmp_path / ".tmp-fifo.json-abcdefgh")
    live = tmp_path / ".tmp-live.json-zz99zz99"
    live.write_text("being written right now")
    with open(live) as held:
        fcntl.flock(held, fcntl.LOCK_EX)  # what a live writer in another instance holds
        removed = clean_stale_temp_files(tmp_path)
    assert removed == [ours]
    for name, text in keep.items():
        assert (tmp_path / name).read_text() == text
    assert live.exists() and (other / "target").exists() and (tmp_path / ".tmp-dir.json-abcdefgh").is_dir()
    assert (tmp_path / ".tmp-fifo.json-abcdefgh").exists()
    assert clean_stale_temp_files(tmp_path / "missing") == []


def test_a_cleaner_racing_a_live_writer_never_breaks_its_write(tmp_path: Path) -> None:
    """Another instance cleaning the same directory over and over while this one writes: every write lands."""
    target = tmp_path / "spec.json"
    pid = os.fork()
    if pid == 0:
        try:
            deadline = time.monotonic() + 3
            while time.monotonic() < deadline:
                clean_stale_temp_files(tmp_path)
        finally:
            os._exit(0)
    try:
        for i in range(300):
            atomic_write_text(target, f"{i}\n")
            assert target.read_text() == f"{i}\n"
    finally:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
    assert temp_files(tmp_path) == []


@pytest.mark.parametrize("name", [".tmp-a-abcdefgh", ".tmp-checkpoint.json-0_9zyxwv", ".tmp-x-y-12345678"])
def test_temp_name_pattern(name: str) -> None:
    assert is_temp_name(name)
