"""Checks to wait on (with :func:`accel_rig.polling.until`) instead of sleeping."""

from __future__ import annotations

from collections.abc import Callable

import pytest


def logged(caplog: pytest.LogCaptureFixture, text: str) -> Callable[[], bool]:
    """A check that is true once a log record's message contains ``text``."""
    return lambda: any(text in r.getMessage() for r in caplog.records)
