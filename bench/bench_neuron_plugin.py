"""Neuron device plugin figures on a fake trn2.48xlarge at LNC 1 (16 devices, 128 NeuronCores).

1. Connected-set share: random allocate/free sequences of ``aws.amazon.com/neuron`` requests (sizes 1/2/4/8/16);
   for every request where a connected set was free, did the allocator return one? Ours vs first-fit (lowest
   free IDs), each on its own run of the same request stream. Also: NeuronCore requests packed onto the fewest
   devices, ours vs first-fit.
2. GetPreferredAllocation and Allocate latency, p50/p99, measured by the kubelet stand-in (this process) against
   a real ``neuron-device-plugin serve`` process over its unix sockets: the full kubelet-side round trip.
3. RSS of that daemon process after the RPCs.

    PYTHONPATH=. .venv/bin/python bench/bench_neuron_plugin.py [--sequences 200] [--calls 1000]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import psutil
from accel_rig.kubelet_standin import KubeletStandIn

from accel_core.deviceplugin.kubeletservice import edits_to_response
from accel_core.fakehost import build_host
from accel_core.paths import HostPaths
from neuron_dra.allocation import choose_cores, choose_devices
from neuron_dra.deviceplugin import NeuronCorePolicy, NeuronDevicePolicy, NeuronNode
from neuron_dra.topology import Topology

NEURON = "aws.amazon.com/neuron"
CORE = "aws.amazon.com/neuroncore"
SIZES = [1, 1, 1, 1, 2, 2, 4, 4, 4, 8, 8, 16]
REPO = Path(__file__).resolve().parents[1]

Strategy = Callable[[Topology, list[int], int], tuple[int, ...]]


def ours(topo: Topology, free: list[int], size: int) -> tuple[int, ...]:
    return choose_devices(topo, free, (), size).ids


def first_fit(topo: Topology, free: list[int], size: int) -> tuple[int, ...]:
    return tuple(sorted(free)[:size])


def connected_share(topo: Topology, strategy: Strategy, sequences: int, seed: int) -> tuple[int, int, int]:
    """(requests, requests with a connected set free, of those given one)."""
    rng = random.Random(seed)
    requests = free_cases = given = 0
    for _ in range(sequences):
        free = set(range(topo.device_count))
        held: list[tuple[int, ...]] = []
        for _ in range(50):
            if held and (rng.random() < 0.4 or not free):
                free.update(held.pop(rng.randrange(len(held))))
                continue
            size = rng.choice(SIZES)
            if size > len(free):
                continue
            mask = sum(1 << i for i in free)
            available = any(m & mask == m for m in topo.candidate_masks(size))
            ids = strategy(topo, sorted(free), size)
            requests += 1
            if available:
                free_cases += 1
                given += topo.is_preferred_set(ids)
            free.difference_update(ids)
            held.append(ids)
    return requests, free_cases, given


def core_packing(topo: Topology, per: int, use_ours: bool, sequences: int, seed: int) -> tuple[int, int]:
    """(core requests, of those placed on the minimum number of devices)."""
    rng = random.Random(seed)
    total = packed = 0
    for _ in range(sequences):
        free = set(range(topo.device_count * per))
        held: list[tuple[int, ...]] = []
        for _ in range(60):
            if held and (rng.random() < 0.4 or not free):
                free.update(held.pop(rng.randrange(len(held))))
                continue
            size = rng.choice([1, 1, 2, 2, 3, 4, 8, 16])
            if size > len(free):
                continue
            ids = (choose_cores(topo, per, sorted(free), (), size).ids if use_ours
                   else tuple(sorted(free)[:size]))
            total += 1
            packed += len({c // per for c in ids}) == -(-size // per)
            free.difference_update(ids)
            held.append(ids)
    return total, packed


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


def ms(values: list[float]) -> str:
    return f"p50 {statistics.median(values) * 1e3:.3f} ms, p99 {pct(values, 0.99) * 1e3:.3f} ms (n={len(values)})"


async def daemon_figures(root: Path, calls: int, pace: float) -> None:
    """Latency of GetPreferredAllocation and Allocate against a real daemon process, then its RSS."""
    standin = KubeletStandIn(root / "kubelet")
    await standin.start(pod_resources=True)
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "neuron_dra.deviceplugin.cli", "serve", "--host-root", str(root / "host"),
        *standin.daemon_flags(), "--metrics-port", "0", "--log-level", "WARNING",
        "--pod-resources-interval", "0.1", "--allocation-grace", "0",
        env=env, stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL)
    rng = random.Random(7)
    topo = Topology.regular("torus4x4", 16)
    try:
        await standin.wait_registered(NEURON, timeout=60)
        await standin.wait_registered(CORE, timeout=60)
        await standin.wait_devices(CORE, lambda d: len(d) == 128, timeout=30)
        pref_dev: list[float] = []
        pref_core: list[float] = []
        for _ in range(calls):
            free = rng.sample(range(16), rng.randint(4, 16))
            size = rng.choice([s for s in SIZES if s <= len(free)])
            t0 = time.perf_counter()
            got = await standin.preferred(NEURON, [str(i) for i in free], [], size)
            pref_dev.append(time.perf_counter() - t0)
            assert len(got) == size
            cores = rng.sample(range(128), rng.randint(32, 128))
            t0 = time.perf_counter()
            await standin.preferred(CORE, [str(i) for i in cores], [], rng.randint(1, 32))
            pref_core.append(time.perf_counter() - t0)
        alloc: dict[tuple[str, float], list[float]] = {}
        for pause in (0.0, pace):
            dev_key, core_key = (NEURON, pause), (CORE, pause)
            alloc[dev_key], alloc[core_key] = [], []
            for _ in range(calls):
                ids = [str(i) for i in choose_devices(topo, range(16), (), rng.choice(SIZES)).ids]
                t0 = time.perf_counter()
                await standin.allocate(NEURON, ids)
                alloc[dev_key].append(time.perf_counter() - t0)
                await asyncio.sleep(pause)
            # PodResources polls (grace 0) release the unconfirmed device allocations before the core phase
            await standin.wait_devices(CORE, lambda d: all(x.health == "Healthy" for x in d), timeout=10)
            for _ in range(calls):
                start = rng.randrange(0, 120)
                ids = [str(c) for c in range(start, start + rng.randint(1, 8))]
                t0 = time.perf_counter()
                await standin.allocate(CORE, ids)
                alloc[core_key].append(time.perf_counter() - t0)
                await asyncio.sleep(pause)
            await standin.wait_devices(NEURON, lambda d: all(x.health == "Healthy" for x in d), timeout=10)
        await asyncio.sleep(1.0)
        rss = psutil.Process(proc.pid).memory_info().rss
        print(f"GetPreferredAllocation neuron     : {ms(pref_dev)}")
        print(f"GetPreferredAllocation neuroncore : {ms(pref_core)}")
        for (resource, pause), values in alloc.items():
            label = "back-to-back" if not pause else f"{pause * 1e3:.0f} ms apart"
            print(f"Allocate {resource.split('/')[1]:10} {label:13}: {ms(values)}")
        print(f"RSS of neuron-device-plugin serve : {rss / 2**20:.1f} MiB (after {6 * calls} RPCs)")
    finally:
        proc.terminate()
        await proc.wait()
        await standin.stop()


def handler_figures(root: Path, calls: int) -> None:
    """Plugin-side work of one RPC (policy + response building), without gRPC or the event loop."""
    node = NeuronNode(HostPaths(host_root=root / "host", kubelet_root=root / "none",
                                device_plugins=root / "none" / "device-plugins"), grace=0.0)
    node.rediscover()
    dev, core = NeuronDevicePolicy(node), NeuronCorePolicy(node)
    rng = random.Random(5)
    pref: list[float] = []
    alloc: list[float] = []
    for _ in range(calls):
        free = [str(i) for i in rng.sample(range(128), rng.randint(32, 128))]
        t0 = time.perf_counter()
        core.preferred(free, [], rng.randint(1, 32))
        pref.append(time.perf_counter() - t0)
        ids = [str(i) for i in choose_devices(dev.node.inventory.topology, range(16), (), rng.choice(SIZES)).ids]
        t0 = time.perf_counter()
        edits_to_response(dev.allocate(ids))
        alloc.append(time.perf_counter() - t0)
        node.usage.apply_list({})
    print(f"handler only, preferred neuroncore: {ms(pref)}")
    print(f"handler only, Allocate neuron     : {ms(alloc)}")


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--sequences", type=int, default=200, help="random allocate/free sequences per strategy")
    parser.add_argument("--calls", type=int, default=1000, help="RPCs per latency figure")
    parser.add_argument("--pace", type=float, default=0.01,
                        help="seconds between paced Allocates (the kubelet admits pods one by one, not in a burst)")
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="nb-", dir="/tmp"))
    try:
        build_host(root / "host", "trn2.48xlarge", lnc=1)
        topo = Topology.regular("torus4x4", 16)
        print("trn2.48xlarge, LNC 1: 16 devices, 128 NeuronCores")
        for name, strategy in (("ours", ours), ("first-fit", first_fit)):
            requests, free_cases, given = connected_share(topo, strategy, args.sequences, seed=11)
            print(f"connected set when one was free [{name:9}]: {given}/{free_cases} = "
                  f"{100 * given / max(1, free_cases):.1f}%  (requests {requests}, connected overall "
                  f"{100 * given / max(1, requests):.1f}%)")
        for name, flag in (("ours", True), ("first-fit", False)):
            total, packed = core_packing(topo, 8, flag, args.sequences, seed=12)
            print(f"core requests on fewest devices [{name:9}]: {packed}/{total} = {100 * packed / max(1, total):.1f}%")
        samples: list[float] = []
        rng = random.Random(3)
        for _ in range(args.calls):
            free = rng.sample(range(16), rng.randint(4, 16))
            size = rng.choice([s for s in SIZES if s <= len(free)])
            t0 = time.perf_counter()
            choose_devices(topo, free, (), size)
            samples.append(time.perf_counter() - t0)
        print(f"preferred devices, algorithm only : {ms(samples)}")
        handler_figures(root, args.calls)
        print(f"load average: {', '.join(f'{x:.2f}' for x in os.getloadavg())} on {os.cpu_count()} CPUs")
        asyncio.run(daemon_figures(root, args.calls, args.pace))
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
