"""One running instance per DRA socket: an exclusive ``flock`` on ``dra[-<podUID>].lock`` beside the socket.

A second driver with the same sockets (same driver, same pod UID, or both without one) would unlink the first's
sockets, serve its own, and remove them when it stops, leaving the first UNAVAILABLE; without a pod UID the two
would not even share the rolling-update lock. So the second refuses to start. The two pods of a rolling update have
different pod UIDs, hence different socket and lock file names, and both run.

The lock is held for the life of the process (the kernel drops it when the process ends, however it ends); the
file stays, holding the holder's pid for the message, and is never removed (removing a lock file races with the
next holder).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from pathlib import Path


class DuplicateInstance(Exception):
    """Another live process holds the lock; the message names the lock file and that process's pid."""


class InstanceLock:
    """The per-socket instance lock at ``path``."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self._fd: int | None = None

    @property
    def held(self) -> bool:
        return self._fd is not None

    def acquire(self) -> None:
        """Take the lock without waiting; DuplicateInstance when another process holds it, OSError when the file
        cannot be opened."""
        if self._fd is not None:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _read_pid(fd)
            os.close(fd)
            raise DuplicateInstance(f"another instance (pid {holder}) already serves these sockets: it holds "
                                    f"{self.path}") from None
        except BaseException:
            os.close(fd)
            raise
        with contextlib.suppress(OSError):  # the pid is for the message only
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        self._fd = fd

    def release(self) -> None:
        if self._fd is not None:
            with contextlib.suppress(OSError):
                os.close(self._fd)
            self._fd = None


def _read_pid(fd: int) -> str:
    try:
        text = os.pread(fd, 32, 0).decode("ascii", "replace").strip()
    except OSError:
        text = ""
    return text if text.isascii() and text.isdigit() else "unknown"
