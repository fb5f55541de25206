"""Shared pieces of the side-by-side benchmarks (``bench_compare.py``, ``bench_fleet.py``): where the binaries are,
percentiles, process CPU and RSS, and the result table."""

from __future__ import annotations

import os
import socket
import statistics
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

import psutil

REPO = Path(__file__).resolve().parents[1]
VENV_BIN = REPO / ".venv" / "bin"
PEERS_SCRIPT = REPO / "scripts" / "build-kube-peers.sh"
PEER_BINARIES = ("sample-device-plugin", "dra-test-driver", "noopplugin")


def peers_bin_dir() -> Path:
    """Where ``scripts/build-kube-peers.sh`` puts (or would put) the Go peers."""
    out = subprocess.run([str(PEERS_SCRIPT), "--print-dir"], check=True, capture_output=True, text=True).stdout
    return Path(out.strip())


def missing_peers(bin_dir: Path) -> list[str]:
    return [b for b in PEER_BINARIES if not os.access(bin_dir / b, os.X_OK)]


def console_script(name: str) -> str:
    """A daemon's real entry point in the project's venv (what the image runs), else the one on PATH."""
    path = VENV_BIN / name
    return str(path) if path.exists() else name


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def p50(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))] if ordered else float("nan")


def cpu_seconds(pid: int) -> float:
    """User + system CPU of a process and its live children so far."""
    proc = psutil.Process(pid)
    times = proc.cpu_times()
    total = times.user + times.system
    for child in proc.children(recursive=True):
        try:
            t = child.cpu_times()
        except psutil.Error:
            continue
        total += t.user + t.system
    return total


def rss_mib(pid: int) -> float:
    return psutil.Process(pid).memory_info().rss / 2**20


@dataclass
class Row:
    """One figure: ours, the Go peer and the floors, in one unit; ``target`` says what passes."""

    figure: str
    unit: str
    ours: float
    peer: float | None = None
    py_floor: float | None = None
    go_floor: float | None = None
    target: str = ""
    met: bool | None = None
    note: str = ""


@dataclass
class Table:
    rows: list[Row] = field(default_factory=list)

    def add(self, row: Row) -> Row:
        self.rows.append(row)
        return row

    def render(self) -> str:
        def num(v: float | None, unit: str) -> str:
            if v is None:
                return "-"
            return f"{v:.3f}" if unit == "ms" and v < 10 else f"{v:.2f}" if v < 100 else f"{v:.0f}"

        header = ("figure", "unit", "ours", "Go peer", "ours/Go", "Py floor", "above Py floor", "Go floor",
                  "target", "met")
        lines = [header]
        for r in self.rows:
            ratio = f"{r.ours / r.peer:.2f}x" if r.peer else "-"
            above = f"{r.ours - r.py_floor:+.3f}" if r.py_floor is not None else "-"
            met = "-" if r.met is None else ("yes" if r.met else "NO")
            lines.append((r.figure, r.unit, num(r.ours, r.unit), num(r.peer, r.unit), ratio,
                          num(r.py_floor, r.unit), above, num(r.go_floor, r.unit), r.target, met))
        widths = [max(len(str(line[i])) for line in lines) for i in range(len(header))]
        out = ["  ".join(str(c).ljust(w) for c, w in zip(line, widths, strict=True)).rstrip() for line in lines]
        out.insert(1, "  ".join("-" * w for w in widths))
        notes = [f"  {r.figure}: {r.note}" for r in self.rows if r.note]
        return "\n".join(out + (["notes:", *notes] if notes else []))
