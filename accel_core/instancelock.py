"""One daemon instance per set of sockets on a node: an exclusive ``flock`` on a lock file of those sockets.

Two instances of the same daemon on one node delete each other's sockets (device plugins re-register forever; a
DRA driver's duplicate leaves the first UNAVAILABLE when it stops). Before a daemon serves (and so before it removes
a socket of that name) it takes its lock; if another process holds it, it stops with :class:`InstanceConflict`
naming that process (its pid is in the file), and the daemon exits 2. Where the lock files live:

- a device plugin: ``<device-plugins dir>/LOCK_DIR/<socket>.lock`` (:meth:`InstanceLock.for_device_plugin`), in a
  sub-directory because the kubelet, when it starts, deletes the files in the device-plugins directory but not its
  sub-directories;
- a DRA driver: ``dra[-<podUID>].lock`` beside its DRA socket
  (``accel_core.dra.sockets.instance_lock_path``); the two
  pods of a rolling update have different pod UIDs, so different sockets and lock files, and both run.
 The kernel drops a ``flock`` when its holder exits, however
it exits, so a lock file left by a dead process never blocks a restart; the files are therefore never removed
(removing one would let two processes lock two different files of the same name).

A lock path that cannot hold a lock (a symlink, a directory, a FIFO or any other non-regular file there, or a
directory the file cannot be created in) is :class:`LockPathError`: one line naming the path and what it is, and
the daemon exits 2 (a retry cannot fix it; the file is never removed for the daemon, see above).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import stat
from pathlib import Path

from accel_core.hostfiles import parse_index

#: the sub-directory of the device-plugins directory that holds the lock files
LOCK_DIR = ".aws-accel-agents-locks"
_PID_BYTES = 32


class InstanceConflict(Exception):
    """Another process serves the same device-plugin socket on this node."""


class LockPathError(OSError):
    """The lock path cannot hold a lock; the message names the path and what is there."""


class InstanceLock:
    """The lock file ``path``; :meth:`acquire` again after the file was replaced re-takes it."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self._fd: int | None = None

    @classmethod
    def for_device_plugin(cls, device_plugins_dir: Path, socket_name: str) -> InstanceLock:
        return cls(device_plugins_dir / LOCK_DIR / f"{socket_name}.lock")

    @property
    def held(self) -> bool:
        return self._fd is not None

    def acquire(self) -> None:
        """Take the lock (a no-op while held and the file is still ours); InstanceConflict naming the holder."""
        if self._fd is not None:
            if _same_file(self._fd, self.path):
                return
            self.release()  # the file was removed or replaced: the lock on the old one protects nothing
        fd = self._open()
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _read_pid(fd)
            os.close(fd)
            who = f"pid {holder}" if holder is not None else "another process"
            raise InstanceConflict(f"another instance ({who}) holds {self.path}: it serves these sockets "
                                   "on this node") from None
        except BaseException:
            os.close(fd)
            raise
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        self._fd = fd

    def _open(self) -> int:
        """The lock file, opened read-write (created if absent); LockPathError for anything but a regular file."""
        _refuse_non_regular(self.path)  # before open: opening a device node or a FIFO may have effects of its own
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise LockPathError(f"cannot make the instance lock directory {self.path.parent}: "
                                f"{_why(exc)}") from None
        try:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW | os.O_NONBLOCK, 0o644)
        except OSError as exc:
            _refuse_non_regular(self.path)  # replaced meanwhile
            raise LockPathError(f"cannot open the instance lock file {self.path}: {_why(exc)}") from None
        try:
            _refuse_non_regular(self.path, os.fstat(fd))
        except BaseException:
            os.close(fd)
            raise
        return fd

    def release(self) -> None:
        """Drop the lock (closing the file drops the flock); the file stays."""
        fd, self._fd = self._fd, None
        if fd is not None:
            with contextlib.suppress(OSError):
                os.close(fd)


_KINDS = ((stat.S_ISLNK, "a symlink"), (stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"),
          (stat.S_ISSOCK, "a socket"), (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"))


def _refuse_non_regular(path: Path, st: os.stat_result | None = None) -> None:
    if st is None:
        try:
            st = os.stat(path, follow_symlinks=False)
        except OSError:
            return  # absent (it is created) or unreadable (open says why)
    if stat.S_ISREG(st.st_mode):
        return
    kind = next((name for test, name in _KINDS if test(st.st_mode)), "not a regular file")
    raise LockPathError(f"the instance lock path {path} is {kind}, not a regular file: remove it "
                        "(the daemon creates the file)")


def _why(exc: OSError) -> str:
    """``exc`` in words: a read-only directory or file system says so."""
    reason = exc.strerror or str(exc)
    if exc.errno in (errno.EACCES, errno.EPERM):
        return f"{reason} (a read-only directory for this daemon)"
    if exc.errno == errno.EEXIST:
        return f"{reason} (not a directory)"
    return reason


def _same_file(fd: int, path: Path) -> bool:
    try:
        st = os.stat(path, follow_symlinks=False)
    except OSError:
        return False
    own = os.fstat(fd)
    return (st.st_dev, st.st_ino) == (own.st_dev, own.st_ino)


def _read_pid(fd: int) -> int | None:
    try:
        text = os.pread(fd, _PID_BYTES, 0).decode("ascii", "replace").strip()
    except OSError:
        return None
    return parse_index(text, maximum=1 << 22)  # pid_max is at most 2**22
