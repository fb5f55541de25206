"""Prometheus helpers shared by every daemon; the HTTP endpoint itself is :mod:`accel_core.metrics_http`."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable

from prometheus_client.core import Metric
from prometheus_client.registry import Collector

from accel_core.metrics_http import MetricsServer, serve_metrics

__all__ = ["CallbackCollector", "MetricsServer", "serve_metrics"]

log = logging.getLogger(__name__)


class CallbackCollector(Collector):
    """A collector whose metrics are produced at scrape time by a callback (e.g. reading sysfs counters)."""

    def __init__(self, produce: Callable[[], Iterable[Metric]]) -> None:
        self._produce = produce

    def collect(self) -> Iterable[Metric]:
        try:
            yield from self._produce()
        except Exception:  # a scrape must never take the daemon down
            log.exception("metrics collection failed")

    def describe(self) -> Iterable[Metric]:
        return []
