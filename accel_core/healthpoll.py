"""Cheap polling of the few host files that carry device health and raise no change event on real sysfs (EFA port
state, Neuron uncorrected-error counters): :class:`FilePoller` reads their raw bytes and says whether any changed.

It never parses: a change only tells the daemon to run its full (strict) rescan, which explains it. Reads are
bounded and non-blocking (a FIFO or a huge file planted there cannot stall the event loop). :class:`PollTimer`
runs the poll from an event-loop timer.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import Callable, Iterable
from pathlib import Path

log = logging.getLogger(__name__)

READ_LIMIT = 4096
_FLAGS = os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)


class FilePoller:
    """Remembers the content of a set of files; :meth:`changed` re-reads them all and compares.

    The files stay open and each poll is one ``pread`` at offset 0 per file: sysfs regenerates an attribute on
    every read at offset 0, and skipping the path walk of ``open`` makes a poll of 32 deep sysfs paths about half as
    costly on an idle node. A file removed from sysfs fails that read (ENODEV), which counts as a change; a file
    that could not be opened is tried again on every poll. :meth:`watch` (after every full rescan) re-opens all.
    """

    def __init__(self) -> None:
        self._paths: list[str] = []
        self._fds: list[int | None] = []
        self._last: list[bytes | None] = []

    def watch(self, paths: Iterable[Path]) -> None:
        """Set the files to poll (re-opening all). A file polled before keeps its last content as the baseline, so
        a change between the caller's rescan and this call still counts at the next poll; a new file starts from
        its current content."""
        before = dict(zip(self._paths, self._last, strict=True))
        self.close()
        self._paths = [str(p) for p in paths]
        self._fds = [_open(p) for p in self._paths]
        self._last = [before[p] if p in before else _pread(fd) for p, fd in zip(self._paths, self._fds, strict=True)]

    @property
    def paths(self) -> list[str]:
        return list(self._paths)

    def changed(self) -> bool:
        """True when any file's content (or readability) differs from the last read; updates the baseline."""
        changed = False
        fds, last = self._fds, self._last
        for i, fd in enumerate(fds):
            if fd is None:
                fd = fds[i] = _open(self._paths[i])
            now = _pread(fd)
            if now != last[i]:
                last[i] = now
                changed = True
        return changed

    def close(self) -> None:
        for fd in self._fds:
            if fd is not None:
                with contextlib.suppress(OSError):
                    os.close(fd)
        self._fds = []


def _open(path: str) -> int | None:
    try:
        return os.open(path, _FLAGS)
    except OSError:
        return None


def _pread(fd: int | None) -> bytes | None:
    if fd is None:
        return None
    try:
        return os.pread(fd, READ_LIMIT, 0)
    except OSError:  # ENODEV (removed from sysfs), ESPIPE (a FIFO planted there), EISDIR, ...
        return None


class PollTimer:
    """Re-reads a :class:`FilePoller`'s files every ``interval`` seconds from a plain event-loop timer and calls
    ``on_change`` when one differs.

    A timer callback is the cheapest tick asyncio has (no task, no future, no wake of the consumer loop), and an idle
    daemon pays it twice a second for its whole life; the consumer only wakes when something changed.
    """

    def __init__(self, poller: FilePoller, interval: float, on_change: Callable[[], None]) -> None:
        self._poller = poller
        self._interval = interval
        self._on_change = on_change
        self._handle: asyncio.TimerHandle | None = None

    def start(self) -> None:
        self._handle = asyncio.get_running_loop().call_later(self._interval, self._tick)

    def cancel(self) -> None:
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None

    def _tick(self) -> None:
        try:
            if self._poller.changed():
                self._on_change()
        except Exception:  # a poll must never end the timer: the next tick and the rescans still run
            log.exception("health poll failed")
        if self._handle is not None:
            self._handle = asyncio.get_running_loop().call_later(self._interval, self._tick)
