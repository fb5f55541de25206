"""A stand-in for a module's ``fcntl`` that records when a non-blocking ``flock`` found the file taken: tests
wait on that event instead of sleeping to learn that a prepare is waiting for the lock."""

from __future__ import annotations

import asyncio
import fcntl


class FlockBusySpy:
    """Stands in for the plugin module's ``fcntl``: records when a non-blocking flock found the file taken."""

    LOCK_EX, LOCK_NB, LOCK_UN = fcntl.LOCK_EX, fcntl.LOCK_NB, fcntl.LOCK_UN

    def __init__(self) -> None:
        self.busy = asyncio.Event()

    def flock(self, fd: int, op: int) -> None:
        try:
            fcntl.flock(fd, op)
        except BlockingIOError:
            self.busy.set()
            raise
