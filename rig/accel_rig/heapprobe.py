"""Run a daemon so that a test or benchmark can read its native heap:
``python -m accel_rig.heapprobe OUT SCRIPT ARGS...`` runs the console script SCRIPT (an entry point such
as ``neuron-device-plugin``) in this process, and each SIGUSR1 appends one line to OUT: the bytes glibc malloc has
handed out and not had back (``mallinfo2``: ``uordblks + hblkhd``, every arena and mmapped block). That figure is
free of what RSS mixes in: pages the allocator keeps or returns, and pymalloc's own arenas (Python objects under
512 B). Chunks in glibc's per-thread caches (tcache) count as handed out: set
``GLIBC_TUNABLES=glibc.malloc.tcache_count=0`` to see only what the program holds. The line goes on with pymalloc's
arenas and the bytes of its blocks in use (``arenas_allocated_current=N bytes_in_allocated_blocks=M``, from
``sys._debugmallocstats``). Linux with glibc only.

With ``HEAPPROBE_TRACEMALLOC=DIR`` in its environment the daemon also runs tracemalloc (25 frames) and each SIGUSR1
dumps a snapshot to ``DIR/snapshot-N.bin``: compare two with ``tracemalloc.Snapshot.load(...).compare_to(...)`` to
see whether a growth is Python's (it slows the daemon about 2.5x).

A caller uses :func:`wrap` to build the command and :func:`sample` to take one reading; :func:`resident_by_kind`
and :func:`growth_report` tell which of a process's mappings (a library's pages, malloc's heaps, thread stacks,
pymalloc's arenas) an RSS growth is in.
"""

from __future__ import annotations

import ctypes
import dataclasses
import functools
import itertools
import os
import re
import signal
import sys
import tempfile
import time
import tracemalloc
from collections.abc import Callable
from dataclasses import dataclass
from importlib.metadata import entry_points
from pathlib import Path
from types import FrameType


class _MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in
                ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks",
                 "keepcost")]


@functools.cache
def _mallinfo2() -> Callable[[], _MallInfo2]:
    libc = ctypes.CDLL("libc.so.6")
    libc.mallinfo2.restype = _MallInfo2
    return libc.mallinfo2


def heap_in_use() -> int:
    """Bytes malloc has handed out and not had back, in this process."""
    info = _mallinfo2()()
    return int(info.uordblks + info.hblkhd)


def _pymalloc_stats() -> str:
    """pymalloc's arenas and the bytes of its blocks in use, from ``sys._debugmallocstats()`` (which writes to fd 2)."""
    with tempfile.TemporaryFile() as capture:
        saved = os.dup(2)
        try:
            os.dup2(capture.fileno(), 2)
            sys._debugmallocstats()
        finally:
            os.dup2(saved, 2)
            os.close(saved)
        capture.seek(0)
        text = capture.read().decode(errors="replace")
    found = {key: re.search(rf"# {key}\s*=\s*([\d,]+)", text) for key in ("arenas allocated current",
                                                                          "bytes in allocated blocks")}
    return " ".join(f"{key.replace(' ', '_')}={m[1].replace(',', '')}" for key, m in found.items() if m)


def wrap(out: Path, script: str, *args: str) -> list[str]:
    """The command that runs ``script args`` under this probe, writing its readings to ``out``."""
    return [sys.executable, "-m", __name__, str(out), script, *args]


def sample(pid: int, out: Path, timeout: float = 60.0) -> int:
    """Ask the probed process ``pid`` for one reading and return it (bytes)."""
    before = len(out.read_text().splitlines()) if out.exists() else 0
    os.kill(pid, signal.SIGUSR1)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        lines = out.read_text().splitlines() if out.exists() else []
        if len(lines) > before:
            return int(lines[before].split()[0])
        time.sleep(0.01)
    raise TimeoutError(f"no heap reading from process {pid} in {out} within {timeout} s")


@dataclass(frozen=True)
class _Mapping:
    start: int
    end: int
    perms: str
    path: str  # "" for anonymous memory
    rss: int


_ARENA_ALIGN = 64 << 20  # glibc's HEAP_MAX_SIZE on 64-bit: each thread arena's heap is aligned to it


def _kind(mapping: _Mapping, before: _Mapping | None, after: _Mapping | None) -> str:
    if mapping.path.startswith("/"):
        return f"file {Path(mapping.path).name}"
    if mapping.path:
        return mapping.path  # [heap] (malloc's main arena), [stack], [vdso], ...
    reserved_after = after is not None and after.start == mapping.end and not after.path and after.perms == "---p"
    if mapping.start % _ARENA_ALIGN == 0 and reserved_after:
        return "malloc thread arenas"
    guard_before = (before is not None and before.end == mapping.start and not before.path
                    and before.perms == "---p" and before.end - before.start <= 64 << 10)
    return "thread stacks" if guard_before else "other anonymous (pymalloc arenas, large mallocs, ...)"


@dataclass
class Resident:
    """Resident bytes of one kind of mapping, and how many mappings of that kind there are."""

    bytes: int = 0
    mappings: int = 0


def resident_by_kind(pid: int) -> dict[str, Resident]:
    """Resident bytes of process ``pid`` by kind of mapping (``/proc/PID/smaps``): each file by name, malloc's main
    heap, glibc's thread arenas (told by their 64 MiB alignment and reserved tail), thread stacks (told by their guard
    page), and the rest of anonymous memory."""
    mappings: list[_Mapping] = []
    for line in Path(f"/proc/{pid}/smaps").read_text().splitlines():
        head = _SMAPS_HEADER.match(line)
        if head:
            start, end = (int(x, 16) for x in head["range"].split("-"))
            mappings.append(_Mapping(start, end, head["perms"], head["path"].strip(), 0))
        elif mappings and line.startswith("Rss:"):
            mappings[-1] = dataclasses.replace(mappings[-1], rss=int(line.split()[1]) * 1024)
    resident: dict[str, Resident] = {}
    for i, mapping in enumerate(mappings):
        kind = _kind(mapping, mappings[i - 1] if i else None, mappings[i + 1] if i + 1 < len(mappings) else None)
        total = resident.setdefault(kind, Resident())
        total.bytes += mapping.rss
        total.mappings += 1
    return resident


def growth_report(readings: list[dict[str, Resident]], top: int = 6) -> list[str]:
    """One line per interval between successive :func:`resident_by_kind` readings: where its RSS change lies,
    largest first, with the count of mappings where it changed."""
    lines = []
    for n, (before, after) in enumerate(itertools.pairwise(readings), 1):
        changes = []
        for kind in before.keys() | after.keys():
            old, new = before.get(kind, Resident()), after.get(kind, Resident())
            if old != new:
                count = f" ({old.mappings} -> {new.mappings} mappings)" if old.mappings != new.mappings else ""
                changes.append((new.bytes - old.bytes, f"{kind} {(new.bytes - old.bytes) / 1e3:+.0f} KB{count}"))
        grown = [text for _, text in sorted(changes, key=lambda change: -abs(change[0]))[:top]]
        lines.append(f"  RSS change in interval {n}: " + (", ".join(grown) or "none"))
    return lines


_SMAPS_HEADER = re.compile(r"^(?P<range>[0-9a-f]+-[0-9a-f]+) (?P<perms>\S{4}) \S+ \S+ \S+(?P<path>.*)$")


def main() -> None:
    out, script, *args = sys.argv[1:]
    snapshots = os.environ.get("HEAPPROBE_TRACEMALLOC")
    if snapshots:
        tracemalloc.start(25)
    taken = 0

    def report(signum: int, frame: FrameType | None) -> None:
        nonlocal taken
        if snapshots:
            taken += 1
            tracemalloc.take_snapshot().dump(str(Path(snapshots) / f"snapshot-{taken}.bin"))
        with open(out, "a") as fh:
            fh.write(f"{heap_in_use()} {_pymalloc_stats()}\n")

    signal.signal(signal.SIGUSR1, report)
    (entry,) = entry_points(group="console_scripts", name=script)
    sys.argv = [script, *args]
    sys.exit(entry.load()())


if __name__ == "__main__":
    main()
