"""Logging setup: one line per event, ``key=value`` by default, JSON with ``--log-format json``.

Call sites pass structured fields through ``extra={"kv": {...}}`` or use :func:`kv` to build them::

    log.info("registered", extra=kv(resource="vpc.amazonaws.com/efa", devices=32))
"""

from __future__ import annotations

import json
import logging
import sys
import time
from collections.abc import Iterable
from typing import Any

_RESERVED = "kv"


def kv(**fields: Any) -> dict[str, Any]:
    """Structured fields for a log call: ``log.info("msg", extra=kv(a=1))``."""
    return {_RESERVED: fields}


def _quote(value: Any) -> str:
    text = str(value)
    if text == "" or any(c in text for c in ' "=\n\t'):
        return json.dumps(text)
    return text


class KeyValueFormatter(logging.Formatter):
    """``time=... level=INFO logger=x msg="..." key=value ...``."""

    def format(self, record: logging.LogRecord) -> str:
        ts = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + f".{int(record.msecs):03d}Z"
        parts = [f"time={ts}", f"level={record.levelname}", f"logger={record.name}",
                 f"msg={_quote(record.getMessage())}"]
        for key, value in getattr(record, _RESERVED, {}).items():
            parts.append(f"{key}={_quote(value)}")
        if record.exc_info:
            parts.append(f"error={_quote(self.formatException(record.exc_info))}")
        return " ".join(parts)


class JsonFormatter(logging.Formatter):
    """One JSON object per line."""

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "time": record.created,
            "level": record.levelname,
            "logger": record.name,
            "msg": record.getMessage(),
        }
        out.update({k: v if isinstance(v, int | float | bool) else str(v)
                    for k, v in getattr(record, _RESERVED, {}).items()})
        if record.exc_info:
            out["error"] = self.formatException(record.exc_info)
        return json.dumps(out, sort_keys=False)


def setup_logging(level: str = "INFO", fmt: str = "kv") -> None:
    """Configure the root logger once for a daemon."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else KeyValueFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    logging.getLogger("asyncio").setLevel(logging.WARNING)
    logging.getLogger("httpx").setLevel(logging.WARNING)


class ProblemLog:
    """Logs each host problem once when it appears and once when it clears, not again on every rescan.

    A problem is ``(subject, text)``; the subject (a device ID) is logged as ``device`` when not empty.
    """

    def __init__(self, logger: logging.Logger, appeared: str, cleared: str,
                 appeared_without_subject: str | None = None) -> None:
        self._log = logger
        self._appeared = appeared
        self._cleared = cleared
        self._appeared_bare = appeared_without_subject or appeared
        self._current: frozenset[tuple[str, str]] = frozenset()

    def update(self, problems: Iterable[tuple[str, str]]) -> None:
        current = frozenset(problems)
        for subject, text in sorted(current - self._current):
            fields = {"device": subject, "problem": text} if subject else {"problem": text}
            self._log.warning(self._appeared if subject else self._appeared_bare, extra=kv(**fields))
        for subject, text in sorted(self._current - current):
            fields = {"device": subject, "problem": text} if subject else {"problem": text}
            self._log.info(self._cleared, extra=kv(**fields))
        self._current = current
