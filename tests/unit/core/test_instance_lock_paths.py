"""Issue 33 item 9: a lock path that cannot hold a lock is one line naming what is there (LockPathError), never
"another instance holds" and never a raw OSError; a regular file left there by a dead holder is taken."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pytest

from accel_core.instancelock import InstanceConflict, InstanceLock, LockPathError


def _symlink(path: Path) -> None:
    (path.parent / "target").write_text("")
    path.symlink_to(path.parent / "target")


def _read_only_dir(path: Path) -> None:
    path.mkdir()
    path.chmod(0o555)


FAULTS: dict[str, tuple[Callable[[Path], None], str]] = {
    "symlink": (_symlink, "is a symlink"),
    "dangling symlink": (lambda p: p.symlink_to(p.parent / "nowhere"), "is a symlink"),
    "directory": (lambda p: p.mkdir(), "is a directory"),
    "read-only directory": (_read_only_dir, "is a directory"),
    "fifo": (lambda p: os.mkfifo(p), "is a FIFO"),
}


@pytest.mark.parametrize("fault", sorted(FAULTS))
def test_an_unusable_lock_path_names_what_is_there(fault: str, tmp_path: Path) -> None:
    make, words = FAULTS[fault]
    lock = InstanceLock.for_device_plugin(tmp_path, "x.sock")
    lock.path.parent.mkdir(parents=True)
    make(lock.path)
    with pytest.raises(LockPathError) as err:
        lock.acquire()
    message = str(err.value)
    assert message.startswith(f"the instance lock path {lock.path} {words}, not a regular file"), message
    assert "\n" not in message and "another instance" not in message
    assert not isinstance(err.value, InstanceConflict) and not lock.held


def test_a_lock_directory_that_is_a_file_is_named(tmp_path: Path) -> None:
    lock = InstanceLock.for_device_plugin(tmp_path, "x.sock")
    lock.path.parent.write_text("")
    with pytest.raises(LockPathError, match=f"cannot make the instance lock directory {lock.path.parent}: .*not a "
                                            "directory"):
        lock.acquire()


def test_a_lock_file_replaced_by_a_fifo_while_held_is_refused(tmp_path: Path) -> None:
    lock = InstanceLock.for_device_plugin(tmp_path, "x.sock")
    lock.acquire()
    lock.path.unlink()
    os.mkfifo(lock.path)
    with pytest.raises(LockPathError, match="is a FIFO"):
        lock.acquire()
    assert not lock.held


def test_a_stale_regular_file_is_taken(tmp_path: Path) -> None:
    lock = InstanceLock.for_device_plugin(tmp_path, "x.sock")
    lock.path.parent.mkdir(parents=True)
    lock.path.write_text("123\n")  # a dead holder's pid
    lock.acquire()
    assert lock.path.read_text() == f"{os.getpid()}\n"
    lock.release()
