"""Log hygiene for the DRA core: long text cut to a readable length, and repeated warnings rate-limited with counts.

A value from outside (a kubelet's registration error, a claim UID, an error message quoting either) may be
megabytes; a log line carries at most :data:`LOG_TEXT_MAX` characters of it and says how many more there were. A
warning that can fire once per claim (a full queue) is logged at most once per :attr:`Throttle.period`; the next
line that gets through says how many were held back (``... (N more since)``).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

#: Characters of one outside value a log line shows, at most.
LOG_TEXT_MAX = 512


def cut(value: object, most: int = LOG_TEXT_MAX) -> str:
    """``value`` as text, at most ``most`` characters of it, then ``... (N more characters)`` when it was longer."""
    text = value if isinstance(value, str) else str(value)
    if len(text) <= most:
        return text
    return f"{text[:most]}... ({len(text) - most} more characters)"


class Throttle:
    """Logs a repeated message at most once per ``period`` seconds per key; what is held back is counted, and the
    next line logged for that key ends with ``... (N more since)``. Thread-safe."""

    def __init__(self, logger: logging.Logger, period: float = 10.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._log = logger
        self.period = period
        self._clock = clock
        self._lock = threading.Lock()
        self._last: dict[str, float] = {}
        self._held: dict[str, int] = {}

    def log(self, level: int, message: str, *, key: str | None = None, extra: dict[str, Any] | None = None) -> bool:
        """Log ``message`` unless one with the same key (default: the message) was logged within the period;
        True when logged."""
        key = message if key is None else key
        now = self._clock()
        with self._lock:
            last = self._last.get(key)
            if last is not None and now - last < self.period:
                self._held[key] = self._held.get(key, 0) + 1
                return False
            self._last[key] = now
            held = self._held.pop(key, 0)
        self._log.log(level, f"{message} ... ({held} more since)" if held else message, extra=extra)
        return True

    def warning(self, message: str, *, key: str | None = None, extra: dict[str, Any] | None = None) -> bool:
        return self.log(logging.WARNING, message, key=key, extra=extra)

    def held(self, key: str) -> int:
        """How many lines for ``key`` are held back now (not yet reported by a later line)."""
        with self._lock:
            return self._held.get(key, 0)
