"""Cheap polling of the few host files that carry device health and raise no change event on real sysfs (EFA port
state, Neuron uncorrected-error counters): :class:`FilePoller` reads their raw bytes and says whether any changed.

It never parses: a change only tells the daemon to run its full (strict) rescan, which explains it. Reads are
bounded and non-blocking (a FIFO or a huge file planted there cannot stall the event loop).
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

READ_LIMIT = 4096
_FLAGS = os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)


def read_raw(path: str) -> bytes | None:
    """Up to ``READ_LIMIT`` bytes of ``path``, or None when it cannot be read."""
    try:
        fd = os.open(path, _FLAGS)
    except OSError:
        return None
    try:
        return os.read(fd, READ_LIMIT)
    except OSError:
        return None
    finally:
        os.close(fd)


class FilePoller:
    """Remembers the content of a set of files; :meth:`changed` re-reads them all and compares."""

    def __init__(self) -> None:
        self._last: dict[str, bytes | None] = {}

    def watch(self, paths: Iterable[Path]) -> None:
        """Set the files to poll and take their current content as the baseline."""
        self._last = {str(p): read_raw(str(p)) for p in paths}

    @property
    def paths(self) -> list[str]:
        return list(self._last)

    def changed(self) -> bool:
        """True when any file's content (or readability) differs from the last read; updates the baseline."""
        changed = False
        for path, before in self._last.items():
            now = read_raw(path)
            if now != before:
                self._last[path] = now
                changed = True
        return changed
