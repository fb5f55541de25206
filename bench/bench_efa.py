"""EFA device plugin figures on a fake p5.48xlarge (32 EFAs).

    PYTHONPATH=. .venv/bin/python bench/bench_efa.py [--quick]

The daemon runs as a real ``efa_plugin.cli serve`` subprocess against the kubelet stand-in in this process, so
RPC figures include both sides of the unix socket. Prints one line per figure.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable, Sequence
from pathlib import Path

import psutil
from accel_rig.kubelet_standin import KubeletStandIn
from prometheus_client import CollectorRegistry, generate_latest

from accel_core.fakehost import FakeHost, build_host
from accel_core.kubeletapi import deviceplugin_v1beta1_pb2 as dp
from accel_core.metrics import CallbackCollector
from accel_core.paths import HostPaths
from efa_plugin import RESOURCE_NAME
from efa_plugin.allocation import Topology
from efa_plugin.discovery import discover
from efa_plugin.metrics import EfaMetrics
from efa_plugin.policy import EfaPolicy

REPO = Path(__file__).resolve().parents[1]
INSTANCE = "p5.48xlarge"



def first_fit(available: Sequence[str], must_include: Sequence[str], size: int) -> list[str]:
    """The baseline the benchmark compares against: must_include, then the lowest IDs."""
    out = list(dict.fromkeys(must_include))
    out += [a for a in sorted(available) if a not in out]
    return out[: max(size, len(must_include))]

def pct(values: Sequence[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(p / 100 * (len(ordered) - 1))))]


def ms(values: Sequence[float]) -> str:
    return f"p50 {pct(values, 50) * 1e3:.2f} ms, p99 {pct(values, 99) * 1e3:.2f} ms (n={len(values)})"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_daemon(host: FakeHost, kubelet_root: Path, metrics_port: int) -> subprocess.Popen[bytes]:
    env = {**os.environ, "PYTHONPATH": str(REPO), "LOG_LEVEL": "WARNING"}
    return subprocess.Popen(
        [sys.executable, "-m", "efa_plugin.cli", "serve", "--host-root", str(host.root),
         "--kubelet-root", str(kubelet_root),
         "--device-plugins-dir", str(kubelet_root / "device-plugins"), "--metrics-port", str(metrics_port),
         "--metrics-address", "127.0.0.1"],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )


def stop_daemon(proc: subprocess.Popen[bytes]) -> int:
    proc.terminate()
    try:
        return proc.wait(20)
    except subprocess.TimeoutExpired:
        proc.kill()
        return proc.wait()


# ------------------------------------------------------------------------------------------------ allocation policy


def whole_root_share(topo: Topology, choose: Callable[[list[str], list[str], int], list[str]], sequences: int,
                     seed: int) -> tuple[float, int, float]:
    """Share of k x 4 requests (made while >= k roots are wholly free) that got k whole roots; also the share of
    all requests that landed in the fewest possible roots."""
    groups = topo.groups()
    rng = random.Random(seed)
    hits = eligible = tight = total = 0
    for _ in range(sequences):
        free = set(topo.known)
        held: list[list[str]] = []
        for _step in range(40):
            if held and (rng.random() < 0.4 or len(free) < 4):
                free.update(held.pop(rng.randrange(len(held))))
                continue
            size = rng.choice([1, 2, 3, 4, 4, 4, 8, 8, 12, 16])
            if size > len(free):
                continue
            available = sorted(free)
            rng.shuffle(available)
            whole = sum(set(m) <= free for m in groups.values())
            got = choose(available, [], size)
            touched = {topo.group_of[i] for i in got}
            total += 1
            tight += len(touched) == -(-size // 4)
            if size % 4 == 0 and whole >= size // 4:
                eligible += 1
                hits += all(set(groups[g]) <= set(got) for g in touched) and len(touched) == size // 4
            free.difference_update(got)
            held.append(got)
    return hits / max(eligible, 1), eligible, tight / max(total, 1)


def bench_policy(host: FakeHost, quick: bool) -> None:
    paths = HostPaths(host_root=host.root)
    inv = discover(paths)
    topo = Topology(inv.devices)
    n = 100 if quick else 400
    ours, eligible, ours_tight = whole_root_share(topo, topo.preferred, n, 7)
    base, _, base_tight = whole_root_share(topo, first_fit, n, 7)
    print(f"whole-root share of k x 4 requests with k whole roots free: topology-aware {ours:.1%}, first-fit "
          f"{base:.1%} ({eligible} requests over {n} random allocate/free sequences)")
    print(f"requests placed in the fewest possible roots (all sizes): topology-aware {ours_tight:.1%}, "
          f"first-fit {base_tight:.1%}")
    ids = sorted(topo.known)
    rng = random.Random(3)
    times = []
    for _ in range(1000):
        available = rng.sample(ids, rng.randint(8, 32))
        size = rng.randint(1, len(available))
        t0 = time.perf_counter()
        topo.preferred(available, [], size)
        times.append(time.perf_counter() - t0)
    print(f"preferred allocation in-process (policy only): {ms(times)}")

    policy = EfaPolicy(paths)
    policy.rediscover()
    times = []
    for _ in range(20 if quick else 100):
        t0 = time.perf_counter()
        policy.rediscover()
        times.append(time.perf_counter() - t0)
    print(f"host rescan (discovery of 32 devices): {ms(times)}")
    registry = CollectorRegistry()
    registry.register(CallbackCollector(EfaMetrics(policy)))
    times = []
    for _ in range(20 if quick else 100):
        t0 = time.perf_counter()
        text = generate_latest(registry)
        times.append(time.perf_counter() - t0)
    series = sum(1 for line in text.decode().splitlines() if line and not line.startswith("#"))
    print(f"metrics scrape in-process, 32 devices ({series} series): {ms(times)}")


# ------------------------------------------------------------------------------------------------ daemon figures


async def bench_daemon(host: FakeHost, work: Path, quick: bool) -> None:
    standin = KubeletStandIn(work / "k")
    await standin.start()
    port = free_port()
    starts = []
    for _ in range(2 if quick else 5):  # process start -> Register received
        count = standin.registrations.count(RESOURCE_NAME)
        t0 = time.perf_counter()
        proc = start_daemon(host, standin.root, port)
        await standin.wait_registered(RESOURCE_NAME, count=count + 1, timeout=60)
        starts.append(time.perf_counter() - t0)
        if len(starts) < (2 if quick else 5):
            stop_daemon(proc)
    print(f"process start to Register received: {ms(starts)}")
    try:
        await standin.wait_devices(RESOURCE_NAME, lambda d: len(d) == 32)
        await asyncio.sleep(1.0)
        ps = psutil.Process(proc.pid)
        print(f"daemon RSS after start: {ps.memory_info().rss / 2**20:.1f} MiB")
        cpu0 = ps.cpu_times()
        await asyncio.sleep(5 if quick else 10)
        cpu1 = ps.cpu_times()
        busy = (cpu1.user + cpu1.system) - (cpu0.user + cpu0.system)
        print(f"idle daemon CPU (0.5 s rescans of 32 devices): {busy / (5 if quick else 10):.1%} of one core")

        plugin = standin.plugins[RESOURCE_NAME]
        ids = sorted(d.ID for d in plugin.devices)
        rng = random.Random(11)
        times = []
        for _ in range(1000):
            pick = rng.sample(ids, rng.choice([1, 4, 8]))
            req = dp.AllocateRequest(container_requests=[dp.ContainerAllocateRequest(devices_ids=pick)])
            t0 = time.perf_counter()
            await plugin.stub.Allocate(req)
            times.append(time.perf_counter() - t0)
        print(f"Allocate over the unix socket: {ms(times)}")
        times = []
        for _ in range(1000):
            available = rng.sample(ids, rng.randint(8, 32))
            size = rng.randint(1, len(available))
            preq = dp.PreferredAllocationRequest(container_requests=[dp.ContainerPreferredAllocationRequest(
                available_deviceIDs=available, allocation_size=size)])
            t0 = time.perf_counter()
            await plugin.stub.GetPreferredAllocation(preq)
            times.append(time.perf_counter() - t0)
        print(f"GetPreferredAllocation over the unix socket: {ms(times)}")

        times = []
        ibdevs = host.efa_ibdevs
        for i in range(10 if quick else 40):
            ibdev = ibdevs[i % len(ibdevs)]
            device_id = next(d.id for d in discover(HostPaths(host_root=host.root)).devices if d.ibdev == ibdev)
            for state, want in (("DOWN", "Unhealthy"), ("ACTIVE", "Healthy")):
                t0 = time.perf_counter()
                host.set_port_state(ibdev, state)
                await standin.wait_devices(
                    RESOURCE_NAME, lambda d, dev=device_id, w=want: any((x.ID, x.health) == (dev, w) for x in d),
                    timeout=10)
                times.append(time.perf_counter() - t0)
        print(f"port state change to ListAndWatch update: {ms(times)}")

        def scrape() -> float:
            t0 = time.perf_counter()
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
                resp.read()
            return time.perf_counter() - t0

        for _ in range(3):  # warm-up: the first scrapes build caches in the daemon
            await asyncio.to_thread(scrape)
        times = [await asyncio.to_thread(scrape) for _ in range(20 if quick else 100)]
        print(f"metrics scrape over HTTP from the daemon (32 devices): {ms(times)}")
    finally:
        code = stop_daemon(proc)
        print(f"daemon exit code after SIGTERM: {code}")
        await standin.stop()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="fewer repetitions")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bench-efa-", dir="/tmp"))
    host = build_host(work / "h", INSTANCE)
    print(f"== EFA device plugin on a fake {INSTANCE} ({len(host.efa_ibdevs)} EFAs); load average "
          f"{os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")
    try:
        bench_policy(host, args.quick)
        asyncio.run(bench_daemon(host, work, args.quick))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
