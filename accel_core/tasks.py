"""Background tasks that never die silently."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Coroutine
from typing import Any, TypeVar

from accel_core.logs import kv

log = logging.getLogger(__name__)

T = TypeVar("T")


def logged_task(coro: Coroutine[Any, Any, T], what: str) -> asyncio.Task[T]:
    """``create_task(coro)`` whose failure is logged the moment it happens (with its traceback, naming ``what``),
    not only when, or if, someone awaits it."""
    task = asyncio.get_running_loop().create_task(coro, name=what)
    task.add_done_callback(_report)
    return task


def _report(task: asyncio.Task[Any]) -> None:
    if task.cancelled():
        return
    exc = task.exception()
    if exc is not None:
        log.error("background task died; the daemon carries on without it", exc_info=exc,
                  extra=kv(task=task.get_name(), error=exc))


async def queued_until(queue: asyncio.Queue[T], stop: asyncio.Event) -> AsyncIterator[T]:
    """Each item put on ``queue``, in order, until ``stop`` is set (an item waiting then is left in the queue)."""
    stopping = asyncio.create_task(stop.wait())
    try:
        while not stop.is_set():
            getting = asyncio.create_task(queue.get())
            await asyncio.wait({getting, stopping}, return_when=asyncio.FIRST_COMPLETED)
            if not getting.done():
                getting.cancel()
                return
            yield getting.result()
    finally:
        stopping.cancel()
