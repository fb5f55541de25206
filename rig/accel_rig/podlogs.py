"""A container's output from a node's ``/var/log/pods`` (the CRI log format), with the names checked before they
go into a path."""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from pathlib import Path

from accel_core.hostfiles import parse_index
from accel_core.k8snames import is_label, is_subdomain, shown


def check_pod_names(namespace: str, pod: str, container: str | None = None) -> None:
    """ValueError naming each of the three that is not a Kubernetes name (label, subdomain, label)."""
    bad = [f"{what} {shown(value)}" for what, value, ok in (
        ("namespace", namespace, is_label(namespace)), ("pod", pod, is_subdomain(pod)),
        ("container", container, container is None or is_label(container))) if not ok]
    if bad:
        raise ValueError(f"not a Kubernetes name: {', '.join(bad)}")


def container_log_files(pod_logs: Path, namespace: str, pod: str, container: str) -> list[list[Path]]:
    """The CRI log files of a container: one list per pod of that name (oldest pod first), each holding the
    ``<restart>.log`` files of ``<pod_logs>/<ns>_<pod>_<uid>/<container>/`` by restart number."""
    check_pod_names(namespace, pod, container)  # before the names go into a glob: no wildcard, no "..", no "/"
    dirs = sorted(pod_logs.glob(f"{namespace}_{pod}_*/{container}"), key=lambda d: d.stat().st_mtime) \
        if pod_logs.is_dir() else []
    out = []
    for d in dirs:
        restarts = ((parse_index(f.stem), f) for f in d.glob("*.log"))
        out.append([f for n, f in sorted((n, f) for n, f in restarts if n is not None)])
    return out


def cri_log_text(lines: Sequence[str]) -> list[str]:
    """What a container wrote, from CRI log lines (``<time> <stream> <P|F> <text>``; a ``P`` line continues on the
    next), without the prefix; malformed lines are left out."""
    out: list[str] = []
    for line in lines:
        parts = line.split(" ", 3)
        if len(parts) == 4:
            out.append(parts[3] + ("" if parts[2] == "P" else "\n"))
    return out


def pod_log_lines(pod_logs: Path, namespace: str, pod: str, container: str) -> list[str]:
    """The lines a container wrote, from ``<pod_logs>/<ns>_<pod>_<uid>/<container>/<restart>.log`` (CRI format).
    Every pod of that name and every restart, oldest first."""
    out: list[str] = []
    for files in container_log_files(pod_logs, namespace, pod, container):
        for f in files:
            with contextlib.suppress(OSError):
                out += cri_log_text(f.read_text(errors="replace").splitlines())
    return out
