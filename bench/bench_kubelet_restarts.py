"""Memory of the device plugins across kubelet restarts (issue 25 item 9): each daemon runs as a process against
the kubelet stand-in, which restarts (drops the plugins, deletes every socket, listens again) N times; the
daemon re-registers each time. Prints the daemon's RSS after a warm-up and after the restarts.

    PYTHONPATH=.:tests .venv/bin/python bench/bench_kubelet_restarts.py [--restarts 1000] [--warmup 100]
        [--daemon efa|neuron]

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


async def run(daemon: str, restarts: int, warmup: int) -> None:
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
        print(f"{daemon}: RSS after {warmup} warm-up restarts {before / 1e6:.2f} MB, after {restarts} more "
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
    args = parser.parse_args()
    for daemon in args.daemon or sorted(DAEMONS):
        asyncio.run(run(daemon, args.restarts, args.warmup))


if __name__ == "__main__":
    main()
