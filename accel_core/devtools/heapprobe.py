"""Run a daemon so that a test or benchmark can read its native heap:
``python -m accel_core.devtools.heapprobe OUT SCRIPT ARGS...`` runs the console script SCRIPT (an entry point such
as ``neuron-device-plugin``) in this process, and each SIGUSR1 appends one line to OUT: the bytes glibc malloc has
handed out and not had back (``mallinfo2``: ``uordblks + hblkhd``, every arena and mmapped block). That figure is
free of what RSS mixes in: pages the allocator keeps or returns, and pymalloc's own arenas (Python objects under
512 B). Chunks in glibc's per-thread caches (tcache) count as handed out: set
``GLIBC_TUNABLES=glibc.malloc.tcache_count=0`` to see only what the program holds. Linux with glibc only.

With ``HEAPPROBE_TRACEMALLOC=DIR`` in its environment the daemon also runs tracemalloc (25 frames) and each SIGUSR1
dumps a snapshot to ``DIR/snapshot-N.bin``: compare two with ``tracemalloc.Snapshot.load(...).compare_to(...)`` to
see whether a growth is Python's (it slows the daemon about 2.5x).

A caller uses :func:`wrap` to build the command and :func:`sample` to take one reading.
"""

from __future__ import annotations

import ctypes
import functools
import os
import signal
import sys
import time
import tracemalloc
from collections.abc import Callable
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
            return int(lines[before])
        time.sleep(0.01)
    raise TimeoutError(f"no heap reading from process {pid} in {out} within {timeout} s")


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
            fh.write(f"{heap_in_use()}\n")

    signal.signal(signal.SIGUSR1, report)
    (entry,) = entry_points(group="console_scripts", name=script)
    sys.argv = [script, *args]
    sys.exit(entry.load()())


if __name__ == "__main__":
    main()
