"""Flags every daemon shares: paths, logging, metrics."""

from __future__ import annotations

import argparse
import logging
import os

from prometheus_client import disable_created_metrics

from accel_core.logs import kv, setup_logging
from accel_core.paths import HostPaths, add_path_flags, resolve_paths

log = logging.getLogger(__name__)


def add_common_flags(parser: argparse.ArgumentParser, *, metrics_port: int) -> None:
    """Paths (see accel_core.paths), --log-level, --log-format, --metrics-port (env METRICS_PORT; 0 disables)."""
    add_path_flags(parser)
    parser.add_argument("--log-level", default=os.environ.get("LOG_LEVEL", "INFO"),
                        choices=["DEBUG", "INFO", "WARNING", "ERROR"], type=str.upper)
    parser.add_argument("--log-format", default=os.environ.get("LOG_FORMAT", "kv"), choices=["kv", "json"])
    parser.add_argument("--metrics-port", type=int, default=int(os.environ.get("METRICS_PORT", metrics_port)),
                        help=f"Prometheus /metrics port (env METRICS_PORT; default {metrics_port}; 0 disables)")
    parser.add_argument("--metrics-address", default=os.environ.get("METRICS_ADDRESS", "0.0.0.0"))


def setup_from_args(args: argparse.Namespace, *, serving: bool = True) -> HostPaths:
    """Configure logging and resolve paths from parsed common flags (``serving=False`` for read-only commands)."""
    setup_logging(args.log_level, args.log_format)
    disable_created_metrics()  # no *_created series: they double every counter for no operator value
    paths = resolve_paths(args)
    check_roots(paths, kubelet=serving)
    return paths


def check_roots(paths: HostPaths, *, kubelet: bool = True) -> None:
    """One clear line for a host root or kubelet root that is missing or unreadable; the daemon carries on."""
    roots = [("host root", paths.host_root)] + ([("kubelet root", paths.kubelet_root)] if kubelet else [])
    for label, path in roots:
        if not path.is_dir():
            log.error(f"{label} {path} does not exist or is not a directory; carrying on, nothing will be found "
                      "there until it appears", extra=kv(path=str(path)))
        elif not os.access(path, os.R_OK | os.X_OK):
            log.error(f"{label} {path} is not readable; carrying on", extra=kv(path=str(path)))
