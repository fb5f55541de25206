"""A stand-in for a module's ``fcntl`` that records when a non-blocking ``flock`` found the file taken: tests
wait on that event instead of sleeping to learn that a prepare is waiting for the lock. The flock may be tried
from any thread (a DRA server thread, or the event loop), so the event is a thread's: ``await spy.wait_busy(10)``."""

from __future__ import annotations

import asyncio
import fcntl
import threading


class FlockBusySpy:
    """Stands in for the plugin module's ``fcntl``: records when a non-blocking flock found the file taken."""

    LOCK_EX, LOCK_NB, LOCK_UN = fcntl.LOCK_EX, fcntl.LOCK_NB, fcntl.LOCK_UN

    def __init__(self) -> None:
        self.busy = threading.Event()

    async def wait_busy(self, timeout: float) -> None:
        """Until a non-blocking flock found the file taken (TimeoutError after ``timeout`` seconds)."""
        if not await asyncio.to_thread(self.busy.wait, timeout):
            raise TimeoutError("no flock found the file taken")

    def flock(self, fd: int, op: int) -> None:
        try:
            fcntl.flock(fd, op)
        except BlockingIOError:
            self.busy.set()
            raise
