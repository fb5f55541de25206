"""Exponential retry delays with jitter, a cap, and a reset on success: the one backoff of every daemon loop.

``Backoff.next()`` gives the delay before the next attempt (``initial``, then doubled after each failure up to
``cap``, each multiplied by a random factor in ``1 ± jitter`` so many nodes that failed together do not retry
together); ``reset()`` after a success starts again from ``initial``. Callers wait the delay themselves, usually
until it passes or ``stop`` is set (``wait_or_stop``). The random source is injectable so tests are exact.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
from collections.abc import Callable


async def wait_or_stop(stop: asyncio.Event, timeout: float) -> None:
    """Return after ``timeout`` seconds or as soon as ``stop`` is set."""
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(stop.wait(), timeout)


class Backoff:
    """Delays ``initial``, ``initial*factor``, ... capped at ``cap``, each with ``± jitter`` (a fraction) applied."""

    def __init__(self, initial: float = 0.5, cap: float = 30.0, *, factor: float = 2.0, jitter: float = 0.2,
                 rand: Callable[[], float] = random.random) -> None:
        if initial <= 0 or cap < initial:
            raise ValueError(f"backoff needs 0 < initial <= cap, got initial={initial} cap={cap}")
        if factor < 1 or not 0 <= jitter < 1:
            raise ValueError(f"backoff needs factor >= 1 and 0 <= jitter < 1, got factor={factor} jitter={jitter}")
        self.initial = initial
        self.cap = cap
        self.factor = factor
        self.jitter = jitter
        self._rand = rand
        self._current = initial
        #: Failures since the last reset.
        self.failures = 0

    def next(self) -> float:
        """The delay before the next attempt after a failure; grows the following one."""
        delay = self._current * (1 - self.jitter + 2 * self.jitter * self._rand())
        self._current = min(self._current * self.factor, self.cap)
        self.failures += 1
        return delay

    def reset(self) -> None:
        """A success: the next failure waits ``initial`` again."""
        self._current = self.initial
        self.failures = 0
