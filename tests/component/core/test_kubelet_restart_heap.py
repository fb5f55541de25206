"""Issue 25 item 9 (guard): across kubelet restarts each device-plugin daemon's native heap and RSS stay flat, and
it keeps its threads.

The daemon runs as its own process under :mod:`accel_rig.heapprobe` (glibc ``mallinfo2``) against the
kubelet stand-in, which restarts once every resource has its first device list (as a kubelet restart finds streams
that have been up), with the malloc tunables the image gives every daemon (the Dockerfile's ``GLIBC_TUNABLES``):
glibc's per-thread caches off (chunks cached there count as handed out and fill up over the first thousands of
restarts: the allocator's bounded cache, not memory the program holds) and two arenas. What is left is what the
daemon keeps per restart: under +10 B measured here (bench_kubelet_restarts.py). A stream that gRPC abandons inside
an operation (grpc/grpc#43360) costs ~400 B per restart and fails the heap test, as does any Python object kept per
restart (those also fail test_kubelet_restart_objects.py). A daemon that lets gRPC's runtime shut down between its
servers starts ~7 threads per restart (accel_core/grpc_runtime.py): that fails the thread test.
"""

from __future__ import annotations

import asyncio
import re
from pathlib import Path

import pytest
from probed_daemon import DAEMONS, ProbedDaemon

WARMUP, RESTARTS, WINDOWS = 200, 300, 2
#: bytes per restart: ~10x what the daemons keep (under +10 B), a quarter of one abandoned gRPC batch per restart
LIMIT_PER_RESTART = 100
#: RSS over the restarts after the warm-up (measured here: +0.02-0.07 MB; +0.1-0.2 MB more come in the first ~200
#: restarts, as pymalloc and malloc touch the pages they then reuse). Issue 25's bound is 0.3 MB over 1,000.
RSS_LIMIT = 200_000
THREAD_RESTARTS = 30

REPO = Path(__file__).resolve().parents[3]


@pytest.mark.parametrize("script", sorted(DAEMONS))
def test_native_heap_and_rss_stay_flat_across_kubelet_restarts(short_tmp: Path, script: str) -> None:
    """Heap and RSS are read after the warm-up and after each of two windows of restarts. Memory kept per restart
    grows in both windows; a one-off step (a dict or buffer that grows once, pages touched once: seen under loaded
    full runs, +30 KB of heap or +0.2 MB of RSS in one window) grows in one only, so the smaller window's growth is
    the one held to the limits."""
    async def scenario() -> tuple[list[int], list[int]]:
        async with ProbedDaemon(short_tmp, script, env=image_env()) as daemon:
            for _ in range(WARMUP):
                await daemon.restart_kubelet()
            heaps, rss = [await least_heap_in_use(daemon)], [daemon.process.memory_info().rss]
            for _ in range(WINDOWS):
                for _ in range(RESTARTS // WINDOWS):
                    await daemon.restart_kubelet()
                heaps.append(await least_heap_in_use(daemon))
                rss.append(daemon.process.memory_info().rss)
            return heaps, rss

    heaps, rss = asyncio.run(scenario())
    per_window = RESTARTS // WINDOWS
    rates = [(b - a) / per_window for a, b in zip(heaps, heaps[1:], strict=False)]
    assert min(rates) < LIMIT_PER_RESTART, (
        f"{script}: native heap grew {heaps[-1] - heaps[0]:+} B over {RESTARTS} kubelet restarts "
        f"({', '.join(f'{r:+.0f}' for r in rates)} B each, per window)")
    grown = [b - a for a, b in zip(rss, rss[1:], strict=False)]
    assert min(grown) * WINDOWS < RSS_LIMIT, (
        f"{script}: RSS grew {(rss[-1] - rss[0]) / 1e6:+.2f} MB over {RESTARTS} kubelet restarts "
        f"({', '.join(f'{g / 1e6:+.2f}' for g in grown)} MB per window)")


@pytest.mark.parametrize("script", sorted(DAEMONS))
def test_kubelet_restarts_leave_grpc_threads_running(short_tmp: Path, script: str) -> None:
    """gRPC's runtime stays up while the daemon serves again: its threads are the same ones after each restart
    (a runtime shut down and started again brings ~7 new threads per restart)."""

    async def scenario() -> tuple[set[int], set[int]]:
        async with ProbedDaemon(short_tmp, script, env=image_env()) as daemon:
            await daemon.restart_kubelet()
            first = daemon.threads()
            seen = set(first)
            for _ in range(THREAD_RESTARTS):
                await daemon.restart_kubelet()
                seen |= daemon.threads()
            return first, seen

    first, seen = asyncio.run(scenario())
    # asyncio's default executor may add a worker or two when a scan first needs one; never one per restart
    assert len(seen - first) <= 3, f"{script}: {len(seen - first)} new threads over {THREAD_RESTARTS} kubelet restarts"


async def least_heap_in_use(daemon: ProbedDaemon) -> int:
    """The least of three readings: a poll or scan under way in another thread holds memory briefly."""
    readings = []
    for _ in range(3):
        readings.append(await daemon.heap_in_use())
        await asyncio.sleep(0.2)
    return min(readings)


def image_env() -> dict[str, str]:
    """The ``GLIBC_TUNABLES`` the Dockerfile's final stage sets for every daemon."""
    found = re.search(r"GLIBC_TUNABLES=(\S+)", (REPO / "Dockerfile").read_text())
    assert found, "the Dockerfile sets no GLIBC_TUNABLES"
    return {"GLIBC_TUNABLES": found[1]}
