"""Memory of the device plugins across kubelet restarts (issue 25 item 9): each daemon runs as a process (under
rig/accel_rig/heapprobe.py) against the kubelet stand-in, which restarts (drops the plugins, deletes every
socket, listens again) N times; the daemon re-registers each time. Prints the daemon's RSS and its malloc heap in
use (glibc ``mallinfo2``) after a warm-up and at each quarter.

    PYTHONPATH=.:tests .venv/bin/python bench/bench_kubelet_restarts.py [--restarts 1000] [--warmup 100]
        [--daemon efa|neuron] [--streams-up] [--settle SECONDS]

By default the stand-in restarts as soon as every resource has registered again: it ends each ListAndWatch stream
within a millisecond or so of its start, usually while gRPC still has the stream's first read or write under way.
grpcio's asyncio stack (1.85.3 and earlier) leaks the operation array of each batch it abandons that way
(grpc/grpc#43360: a batch whose awaiting task is cancelled, or which fails): ~400 B per restart, linear;
bench/repro_aio_stream_cancel_leak.py shows it with none of the daemon's code. ``--streams-up`` restarts only once
each plugin's first device list has arrived, as a kubelet restart finds streams that have been up for a while
(``--settle`` waits longer still). The neuron daemon's heap then still grows ~150 B per restart at first, slowing
down over thousands of restarts: that is glibc's per-thread cache (tcache) filling, not memory the program holds.
Run with ``GLIBC_TUNABLES=glibc.malloc.tcache_count=0`` and it stays flat (+4 B per restart), and heaptrack, which
sees every allocation and free, finds the same bytes in use after 100 and after 700 restarts. RSS can show one drop
of ~0.5 MB when the allocator gives memory back: read the per-quarter figures, not only the total. Each quarter's
RSS change is also split by kind of mapping (heapprobe.resident_by_kind: glibc's thread arenas, thread stacks,
malloc's main heap, other anonymous memory such as pymalloc's arenas, each file); run with the image's tunables
(``glibc.malloc.tcache_count=0:glibc.malloc.arena_max=2``, the Dockerfile) to see what a deployed daemon does.

Nothing is asserted here; tests/component/efa/test_kubelet_restart_objects.py asserts that the daemon's tasks, gRPC
servers and channels and Python objects do not grow across restarts, and
tests/component/core/test_kubelet_restart_heap.py that its native heap and RSS do not and that it keeps its threads
(the image's tunables, streams up).
bench_real_kubelet_restarts.py does this with the real kubelet.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(1, str(REPO / "tests"))  # the tests' fake hosts and probed daemon

from accel_rig.heapprobe import growth_report, resident_by_kind  # noqa: E402
from probed_daemon import ProbedDaemon  # noqa: E402

DAEMONS = {  # --daemon name -> console script and the instance type of its fake host
    "efa": ("efa-device-plugin", os.environ.get("BENCH_EFA_TYPE", "p4d.24xlarge")),
    "neuron": ("neuron-device-plugin", os.environ.get("BENCH_NEURON_TYPE", "trn1.32xlarge")),
}


async def run(daemon: str, restarts: int, warmup: int, streams_up: bool = False, settle: float = 0.0) -> None:
    script, itype = DAEMONS[daemon]
    base = Path(tempfile.mkdtemp(prefix="bench-kr-", dir="/dev/shm" if os.path.isdir("/dev/shm") else None))
    try:
        async with ProbedDaemon(base, script, itype) as probed:
            async def restart(n: int) -> None:
                for _ in range(n):
                    await probed.restart_kubelet(streams_up, settle)

            await restart(warmup)
            await asyncio.sleep(1)
            before = probed.process.memory_info().rss
            heaps = [await probed.heap_in_use()]
            t0 = time.perf_counter()
            steps = [before]
            maps = [resident_by_kind(probed.proc.pid)]
            for _ in range(4):
                await restart(restarts // 4)
                steps.append(probed.process.memory_info().rss)
                maps.append(resident_by_kind(probed.proc.pid))
                heaps.append(await probed.heap_in_use())
            took = time.perf_counter() - t0
            await asyncio.sleep(1)
            after = probed.process.memory_info().rss
    finally:
        shutil.rmtree(base, ignore_errors=True)
    mode = (", streams up" if streams_up else "") + (f", {settle * 1e3:.0f} ms settle" if settle else "")
    print(f"{daemon}{mode}: RSS after {warmup} warm-up restarts {before / 1e6:.2f} MB, after {restarts} more "
          f"{after / 1e6:.2f} MB: {(after - before) / 1e6:+.2f} MB ({took / restarts * 1e3:.1f} ms per restart); "
          f"every {restarts // 4}: " + " ".join(f"{x / 1e6:.2f}" for x in steps))
    print(f"  malloc heap in use every {restarts // 4}: " + " ".join(f"{x / 1e6:.3f}" for x in heaps) +
          f" MB ({(heaps[-1] - heaps[0]) / restarts:+.0f} B per restart)")
    print("\n".join(growth_report(maps)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--restarts", type=int, default=1000)
    parser.add_argument("--warmup", type=int, default=100)
    parser.add_argument("--daemon", choices=sorted(DAEMONS), action="append")
    parser.add_argument("--streams-up", action="store_true",
                        help="restart only once each plugin's first device list has arrived (see above)")
    parser.add_argument("--settle", type=float, default=0.0,
                        help="seconds to wait after the registrations (and lists) before each restart")
    args = parser.parse_args()
    for daemon in args.daemon or sorted(DAEMONS):
        asyncio.run(run(daemon, args.restarts, args.warmup, args.streams_up, args.settle))


if __name__ == "__main__":
    main()
