"""Prometheus metrics HTTP server and small helpers shared by every daemon."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from typing import Any

from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client.core import Metric
from prometheus_client.registry import Collector

from accel_core.logs import kv

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


def serve_metrics(registry: CollectorRegistry, port: int, address: str = "0.0.0.0") -> Any:
    """Start the /metrics HTTP server in a background thread; port 0 disables it. Returns the server or None."""
    if port <= 0:
        return None
    try:
        server, _thread = start_http_server(port, addr=address, registry=registry)
    except OSError as exc:
        log.error("metrics server could not listen; continuing without it", extra=kv(port=port, error=exc))
        return None
    log.info("metrics server listening", extra=kv(address=address, port=port))
    return server
