"""Memory of the device plugins across kubelet restarts (issue 25 item 9): each daemon runs as a process against
the kubelet stand-in, which restarts (drops the plugins, deletes every socket, listens again) N times; the
daemon re-registers each time. Prints the daemon's RSS after a warm-up and after the restarts.

    PYTHONPATH=.:tests .venv/bin/python bench/bench_kubelet_restarts.py [--restarts 1000] [--warmup 100]
        [--daemon efa|neuron] [--streams-up]

By default the stand-in restarts as soon as every resource has registered again: it ends each ListAndWatch stream
within a millisecond or so of its start, usually while gRPC still has the stream's first read or write under way.
grpcio's asyncio stack (1.85.3 and earlier) leaks a little native memory for each such operation it abandons
(grpc/grpc#43360: the operation array of a batch whose awaiting task is cancelled, or whose batch fails, is never
freed): about half of the neuron daemon's growth in this mode (two streams per restart, 0.5 to 0.7 MB per 1,000
restarts); bench/repro_aio_stream_cancel_leak.py shows that leak with none of the daemon's code. ``--streams-up``
restarts only once each plugin's first device list has arrived, as a kubelet restart finds streams that have been
up for a while: hardly any stream then ends inside a gRPC operation, and the neuron daemon still grows by 0.2 to
0.4 MB per 1,000 restarts (not explained yet). Either way a run can show one drop of ~0.5 MB when the allocator gives
memory back: read the per-quarter figures, not only the total.

Nothing is asserted (RSS depends on the allocator and the machine); tests/component/test_kubelet_restart_objects.py
asserts that the daemon's tasks, gRPC servers and channels and Python objects do not grow across restarts.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil
from hostcache import copy_host

from accel_core.devtools.kubelet_standin import KubeletStandIn

REPO = Path(__file__).resolve().parents[1]
DAEMONS = {
    "efa": (["efa_plugin.cli", "serve"], "p4d.24xlarge", ["vpc.amazonaws.com/efa"]),
    "neuron": (["neuron_dra.deviceplugin.cli", "serve"], "trn1.32xlarge",
               ["aws.amazon.com/neuron", "aws.amazon.com/neuroncore"]),
}


async def run(daemon: str, restarts: int, warmup: int, streams_up: bool = False) -> None:
    cmd, itype, resources = DAEMONS[daemon]
    base = Path(tempfile.mkdtemp(prefix="bench-kr-", dir="/dev/shm" if os.path.isdir("/dev/shm") else None))
    host = copy_host(base / "h", itype)
    standin = KubeletStandIn(base / "k")
    await standin.start(pod_resources=True)
    proc = subprocess.Popen([sys.executable, "-m", *cmd, "--host-root", str(host.root), *standin.daemon_flags(),
                             "--metrics-port", "0", "--log-level", "WARNING"],
                            env={**os.environ, "PYTHONPATH": str(REPO)}, stderr=subprocess.DEVNULL)
    child = psutil.Process(proc.pid)
    count = 1

    async def restart(n: int) -> None:
        nonlocal count
        for _ in range(n):
            await standin.restart()
            count += 1
            for resource in resources:
                await standin.wait_registered(resource, count=count, timeout=30)
                if streams_up:
                    await standin.wait_devices(resource, bool, timeout=30)
            standin.registrations.clear()  # the stand-in's own record, not the daemon's memory
            count = 0

    try:
        for resource in resources:
            await standin.wait_registered(resource, timeout=60)
        standin.registrations.clear()
        count = 0
        await restart(warmup)
        await asyncio.sleep(1)
        before = child.memory_info().rss
        t0 = time.perf_counter()
        steps = [before]
        for _ in range(4):
            await restart(restarts // 4)
            steps.append(child.memory_info().rss)
        took = time.perf_counter() - t0
        await asyncio.sleep(1)
        after = child.memory_info().rss
        mode = ", streams up" if streams_up else ""
        print(f"{daemon}{mode}: RSS after {warmup} warm-up restarts {before / 1e6:.2f} MB, after {restarts} more "
              f"{after / 1e6:.2f} MB: {(after - before) / 1e6:+.2f} MB ({took / restarts * 1e3:.1f} ms per restart); "
              f"every {restarts // 4}: " + " ".join(f"{x / 1e6:.2f}" for x in steps))
    finally:
        proc.terminate()
        proc.wait(30)
        await standin.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--restarts", type=int, default=1000)
    parser.add_argument("--warmup", type=int, default=100)
    parser.add_argument("--daemon", choices=sorted(DAEMONS), action="append")
    parser.add_argument("--streams-up", action="store_true",
                        help="restart only once each plugin's first device list has arrived (see above)")
    args = parser.parse_args()
    for daemon in args.daemon or sorted(DAEMONS):
        asyncio.run(run(daemon, args.restarts, args.warmup, args.streams_up))


if __name__ == "__main__":
    main()
