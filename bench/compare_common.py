"""Shared pieces of the side-by-side benchmarks (``bench_compare.py``, ``bench_fleet.py``): where the binaries are,
percentiles, process CPU and RSS, and the result table."""

from __future__ import annotations

import contextlib
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import tomllib
from collections.abc import Iterator
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


def daemon_argv(name: str, tree: Path | None = None) -> list[str]:
    """The command that starts daemon ``name``: its console script, or, for a baseline ``tree`` (another checkout of
    this project), the same entry point imported from that tree ahead of the installed one."""
    if tree is None:
        return [console_script(name)]
    scripts = tomllib.loads((tree / "pyproject.toml").read_text())["project"]["scripts"]
    module, func = scripts[name].split(":")
    code = f"import sys; sys.path.insert(0, {str(tree)!r}); from {module} import {func}; sys.exit({func}())"
    return [sys.executable, "-c", code]


@contextlib.contextmanager
def baseline_tree(rev: str) -> Iterator[Path]:
    """A detached checkout of ``rev`` in a temp directory (a git worktree), removed afterwards."""
    path = Path(tempfile.mkdtemp(prefix="cmp-base-", dir="/tmp")) / "tree"
    subprocess.run(["git", "-C", str(REPO), "worktree", "add", "--detach", "--quiet", str(path), rev], check=True)
    try:
        yield path
    finally:
        subprocess.run(["git", "-C", str(REPO), "worktree", "remove", "--force", str(path)], check=False)


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


@dataclass
class Versus:
    """This checkout against a baseline revision of it, figure by figure (lower is better for every figure)."""

    base: str
    limit: float = 1.10  #: the largest new/base ratio that passes
    rows: list[tuple[str, str, float, float]] = field(default_factory=list)

    def add(self, figure: str, unit: str, new: float, old: float) -> None:
        self.rows.append((figure, unit, new, old))

    def render(self) -> str:
        header = ("figure", "unit", "this tree", f"baseline {self.base}", "new/base", f"<={self.limit:.2f}x")
        lines = [header]
        for figure, unit, new, old in self.rows:
            ratio = f"{new / old:.2f}x" if old else "-"
            met = "-" if not old else "yes" if new / old <= self.limit else "NO"
            lines.append((figure, unit, f"{new:.3f}", f"{old:.3f}", ratio, met))
        widths = [max(len(line[i]) for line in lines) for i in range(len(header))]
        out = ["  ".join(c.ljust(w) for c, w in zip(line, widths, strict=True)).rstrip() for line in lines]
        out.insert(1, "  ".join("-" * w for w in widths))
        return "\n".join(out)
