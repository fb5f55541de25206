"""Waiting until a condition holds, by polling it: the one helper the demo and the tests use (a test that expects
nothing to happen first waits for the event that shows the code under test has looked, then asserts).

``check`` is called every ``interval`` seconds until it returns something truthy, which is returned; after
``timeout`` seconds a TimeoutError names ``what`` (and the last error ``check`` raised of the ``tolerate`` types,
such as an API server that is not up yet). :func:`poll_until` waits in the calling thread, :func:`until` on the
event loop.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Generic, TypeVar

T = TypeVar("T")


class _Polling(Generic[T]):
    """One wait: its deadline, its attempts and its error."""

    def __init__(self, check: Callable[[], T | None], what: str, timeout: float,
                 tolerate: tuple[type[Exception], ...]) -> None:
        self._check, self._what, self._timeout, self._tolerate = check, what, timeout, tolerate
        self._deadline = time.monotonic() + timeout
        self._last_error: Exception | None = None
        self.value: T | None = None

    def holds(self) -> bool:
        """Call ``check`` once; True when its answer is truthy (kept in ``value``)."""
        try:
            self.value = self._check()
        except self._tolerate as exc:
            self._last_error, self.value = exc, None
        return bool(self.value)

    def expired(self) -> bool:
        return time.monotonic() >= self._deadline

    def error(self) -> TimeoutError:
        last = f" (last error: {self._last_error})" if self._last_error is not None else ""
        return TimeoutError(f"timed out after {self._timeout:g} s waiting for {self._what}{last}")


def poll_until(check: Callable[[], T | None], what: str, timeout: float = 60.0, interval: float = 0.25, *,
               tolerate: tuple[type[Exception], ...] = ()) -> T:
    """Poll ``check`` in this thread until it returns something truthy, and return that."""
    polling = _Polling(check, what, timeout, tolerate)
    while not polling.holds():
        if polling.expired():
            raise polling.error()
        time.sleep(interval)
    assert polling.value is not None
    return polling.value


async def until(check: Callable[[], T | None], what: str, timeout: float = 10.0, interval: float = 0.01, *,
                tolerate: tuple[type[Exception], ...] = ()) -> T:
    """Poll ``check`` on the event loop until it returns something truthy, and return that."""
    polling = _Polling(check, what, timeout, tolerate)
    while not polling.holds():
        if polling.expired():
            raise polling.error()
        await asyncio.sleep(interval)
    assert polling.value is not None
    return polling.value
