"""Waiting on a condition instead of sleeping: a test that expects nothing to happen first waits for the event that
shows the code under test has looked (a log line, a counter, a probe's answer), then asserts."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest


async def until(check: Callable[[], object], what: str, timeout: float = 10.0) -> None:
    """Poll ``check`` on the event loop until it is true; fail naming ``what`` after ``timeout`` seconds."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not check():
        if loop.time() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.01)


def logged(caplog: pytest.LogCaptureFixture, text: str) -> Callable[[], bool]:
    """A check that is true once a log record's message contains ``text``."""
    return lambda: any(text in r.getMessage() for r in caplog.records)
