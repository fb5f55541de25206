"""Allocate latency of a real ``neuron-device-plugin serve`` with and without a flood of /metrics scrapes.

A fake trn2.48xlarge (LNC 1: 16 devices, 128 NeuronCores). This process is the kubelet (stand-in over the real unix
sockets) and measures ``aws.amazon.com/neuron`` Allocate round trips, ``--calls`` per phase, ``--pace`` apart:

1. no scraper;
2. ``--scrapers`` concurrent scrapers in a separate process, each a keep-alive HTTP client calling GET /metrics in
   a tight loop (far beyond any real Prometheus: a flood);

and prints Allocate p50/p99 for both, the scrapes answered per second during phase 2 and their latency.
``--repo DIR`` runs the daemon from another checkout (e.g. the main branch) for a before/after comparison.

    PYTHONPATH=. .venv/bin/python bench/bench_metrics_scrapes.py [--calls 400] [--scrapers 50] [--repo DIR]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from accel_rig.kubelet_standin import KubeletStandIn

from accel_core.fakehost import build_host

NEURON = "aws.amazon.com/neuron"
REPO = Path(__file__).resolve().parents[1]

SCRAPER = r"""
import http.client, sys, threading, time
port, threads, seconds = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])
lat, errors, lock = [], [0], threading.Lock()
deadline = time.monotonic() + seconds
def run():
    conn = None
    while time.monotonic() < deadline:
        try:
            conn = conn or http.client.HTTPConnection("127.0.0.1", port, timeout=30)
            t0 = time.perf_counter()
            conn.request("GET", "/metrics", headers={"Accept-Encoding": "gzip"})
            resp = conn.getresponse(); resp.read()
            with lock: lat.append(time.perf_counter() - t0)
        except Exception:
            with lock: errors[0] += 1
            conn = None; time.sleep(0.01)
ts = [threading.Thread(target=run) for _ in range(threads)]
[t.start() for t in ts]; [t.join() for t in ts]
lat.sort()
p = lambda q: lat[min(len(lat) - 1, int(q * (len(lat) - 1)))] * 1e3 if lat else float("nan")
print(f"{len(lat)} {errors[0]} {p(0.5):.2f} {p(0.99):.2f}")
"""


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def allocate_round(standin: KubeletStandIn, calls: int, pace: float, rng: random.Random) -> list[float]:
    out = []
    for _ in range(calls):
        size = rng.choice([1, 2, 4, 8, 16])
        start = rng.randrange(0, 16 - size + 1)
        t0 = time.perf_counter()
        await standin.allocate(NEURON, [str(i) for i in range(start, start + size)])
        out.append(time.perf_counter() - t0)
        await asyncio.sleep(pace)
    return out


async def run(root: Path, repo: Path, calls: int, pace: float, scrapers: int) -> None:
    standin = KubeletStandIn(root / "kubelet")
    await standin.start(pod_resources=True)
    port = free_port()
    env = {**os.environ, "PYTHONPATH": str(repo)}
    daemon_log = (root / "daemon.log").open("wb")
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "neuron_dra.deviceplugin.cli", "serve", "--host-root", str(root / "host"),
        "--kubelet-root", str(standin.root), "--metrics-port", str(port), "--metrics-address", "127.0.0.1",
        "--log-level", "WARNING", "--pod-resources-interval", "0.1", "--allocation-grace", "0",
        cwd=str(repo), env=env, stdout=asyncio.subprocess.DEVNULL, stderr=daemon_log)
    rng = random.Random(7)
    try:
        try:
            await standin.wait_registered(NEURON, timeout=60)
        except TimeoutError:
            sys.exit(f"the daemon did not register; its log:\n{(root / 'daemon.log').read_text()[-3000:]}")
        await standin.wait_devices(NEURON, lambda d: len(d) == 16, timeout=30)
        await allocate_round(standin, 50, pace, rng)  # warm-up
        quiet = await allocate_round(standin, calls, pace, rng)
        duration = calls * (pace + statistics.median(quiet)) + 5
        flood = subprocess.Popen([sys.executable, "-c", SCRAPER, str(port), str(scrapers), str(duration)],
                                 stdout=subprocess.PIPE, text=True)
        await asyncio.sleep(2.0)  # let every scraper connect and the flood settle
        t0 = time.monotonic()
        loaded = await allocate_round(standin, calls, pace, rng)
        loaded_s = time.monotonic() - t0
        out, _ = await asyncio.to_thread(flood.communicate)
        scrapes, errors, s50, s99 = out.split()
        label = "this checkout" if repo == REPO else str(repo)
        print(f"daemon from {label}; Allocate {NEURON}, {calls} calls {pace * 1e3:.0f} ms apart")
        print(f"  no scraper        : p50 {statistics.median(quiet) * 1e3:.2f} ms, p99 {pct(quiet, 0.99) * 1e3:.2f} ms")
        print(f"  {scrapers} scrapers       : p50 {statistics.median(loaded) * 1e3:.2f} ms, "
              f"p99 {pct(loaded, 0.99) * 1e3:.2f} ms")
        print(f"  scrapes answered  : {int(scrapes) / (duration + 0.0):.0f}/s over the flood ({scrapes} in "
              f"{duration:.0f} s, {errors} errors), scrape latency p50 {s50} ms, p99 {s99} ms "
              f"(Allocate phase {loaded_s:.1f} s)")
    finally:
        proc.terminate()
        await proc.wait()
        daemon_log.close()
        await standin.stop()


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=400, help="Allocate calls per phase")
    parser.add_argument("--pace", type=float, default=0.01, help="seconds between Allocates")
    parser.add_argument("--scrapers", type=int, default=50, help="concurrent scrapers in the flood")
    parser.add_argument("--repo", type=Path, default=REPO, help="checkout to run the daemon from")
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="ms-", dir="/tmp"))
    try:
        build_host(root / "host", "trn2.48xlarge", lnc=1)
        print(f"load average: {', '.join(f'{x:.2f}' for x in os.getloadavg())} on {os.cpu_count()} CPUs")
        asyncio.run(run(root, args.repo.resolve(), args.calls, args.pace, args.scrapers))
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
