"""A cheap tripwire for the shared fake-host trees: inotify watches on every directory of a tree report any
create, delete, rename, write or attribute change below it, so the check after each test costs one non-blocking
read instead of a stat of ~17k entries. Only a tree that tripped is fingerprinted in full (to name the paths).

Where inotify is unavailable or the watch limit is reached, :meth:`TreeWatch.watch` returns False and the caller
keeps checking that tree the slow way.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import os
from pathlib import Path

_IN_NONBLOCK = os.O_NONBLOCK
_IN_CLOEXEC = os.O_CLOEXEC
# IN_MODIFY | IN_ATTRIB | IN_MOVED_FROM | IN_MOVED_TO | IN_CREATE | IN_DELETE | IN_DELETE_SELF | IN_MOVE_SELF
_MASK = 0x002 | 0x004 | 0x040 | 0x080 | 0x100 | 0x200 | 0x400 | 0x800
_HEADER = 16  # struct inotify_event: wd, mask, cookie, len (4 x 4 bytes), then the name


class TreeWatch:
    def __init__(self) -> None:
        self._libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
        self._fd = self._libc.inotify_init1(_IN_NONBLOCK | _IN_CLOEXEC)
        self._tree_of: dict[int, Path] = {}
        self._tripped: set[Path] = set()

    def watch(self, root: Path) -> bool:
        """Watch every directory of ``root``; False when that cannot be done completely."""
        if self._fd < 0:
            return False
        for directory, _, _ in os.walk(root):
            wd = self._libc.inotify_add_watch(self._fd, os.fsencode(directory), _MASK)
            if wd < 0:
                return False
            self._tree_of[wd] = root
        return True

    def tripped(self) -> set[Path]:
        """The watched trees changed since the last call (and forget them)."""
        while True:
            try:
                data = os.read(self._fd, 65536)
            except BlockingIOError:
                break
            except OSError as exc:
                if exc.errno == errno.EINTR:
                    continue
                raise
            at = 0
            while at + _HEADER <= len(data):
                wd = int.from_bytes(data[at:at + 4], "little", signed=True)
                length = int.from_bytes(data[at + 12:at + 16], "little")
                tree = self._tree_of.get(wd)
                if tree is not None:
                    self._tripped.add(tree)
                elif wd == -1:  # IN_Q_OVERFLOW: events were lost, so every tree counts as changed
                    self._tripped.update(self._tree_of.values())
                at += _HEADER + length
        out, self._tripped = self._tripped, set()
        return out
