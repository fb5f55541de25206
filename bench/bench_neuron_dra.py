"""Neuron DRA driver figures.

1. Prepare of a 16-device claim (trn2.48xlarge fake host): the handler without the API read (config decoding,
   checkpoint writes, CDI spec), the API read alone (a real kube-apiserver), and the whole prepare through the
   DRA socket (kubelet stand-in -> gRPC -> handler -> API read -> files). p50/p99 over --iterations.
2. Start to slices published: ``neuron-dra-driver serve`` launched as a process until its ResourceSlice is
   visible in the API server.
3. API writes while idle: the same process's ``accel_dra_resourceslice_writes_total`` over --idle-seconds
   (default 60; the target is 0 in 10 minutes), and whether the slice's resourceVersion moved.
4. RSS of that process after the idle window.

Parts 1b, 1c and 2-4 need the Kubernetes binaries (scripts/build-kube.sh); without them only 1a runs.

    PYTHONPATH=. .venv/bin/python bench/bench_neuron_dra.py [--iterations 300] [--idle-seconds 60]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

import msgspec
import psutil
from accel_rig.controlplane import ControlPlane
from accel_rig.kubelet_standin import KubeletStandIn
from accel_rig.kubeversions import kube_bin_dir, missing_binaries
from lightkube import AsyncClient, Client, KubeConfig
from lightkube.resources.resource_v1 import ResourceClaim, ResourceSlice

from accel_core.dra.cdi import CdiSpecWriter
from accel_core.dra.checkpoint import read_boot_id
from accel_core.dra.claimget import DirectClaimGet
from accel_core.dra.claims import ClaimReader
from accel_core.dra.cli import API_KEEPALIVE_SECONDS, kube_config
from accel_core.dra.pluginserver import DraPlugin
from accel_core.dra.preparation import CDI_CLASS, DraDriver, cdi_vendor
from accel_core.dra.store import ClaimStore
from accel_core.dra.types import ClaimRef
from accel_core.fakehost import build_host
from accel_core.paths import HostPaths
from neuron_dra.discovery import discover
from neuron_dra.dra.profile import NeuronProfile

REPO = Path(__file__).resolve().parents[1]
NODE = "bench-node"
DRIVER = "neuron.aws.com"


def pct(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(p / 100 * (len(ordered) - 1))))]


def ms(values: list[float]) -> str:
    return (f"p50 {pct(values, 50) * 1000:.2f} ms, p99 {pct(values, 99) * 1000:.2f} ms, "
            f"max {max(values) * 1000:.2f} ms (n={len(values)})")


def claim_dict(uid: str, name: str) -> dict[str, Any]:
    return {"metadata": {"namespace": "bench", "name": name, "uid": uid},
            "status": {"allocation": {"devices": {"results": [
                {"request": "neurons", "driver": DRIVER, "pool": NODE, "device": f"neuron-device-{i}"}
                for i in range(16)]}}}}


class DictReader:
    """Claims already decoded (as the claim GET returns them), so the local figures leave the API read out."""

    def __init__(self) -> None:
        self.claims: dict[tuple[str, str], ResourceClaim] = {}

    def get(self, namespace: str, name: str) -> ResourceClaim | None:
        return self.claims.get((namespace, name))

    def close(self) -> None:
        pass


def make_driver(root: Path) -> tuple[DraDriver, HostPaths]:
    paths = HostPaths(host_root=root / "host", kubelet_root=root / "kubelet", cdi_root=root / "cdi",
                      device_plugins=root / "kubelet" / "device-plugins")
    if not paths.host_root.exists():
        build_host(paths.host_root, "trn2.48xlarge")
    inv = discover(paths)
    store = ClaimStore(paths.plugins_data_dir / DRIVER / "checkpoint.json", read_boot_id(paths.host_root))
    store.load()
    cdi = CdiSpecWriter(paths.cdi_root, cdi_vendor(DRIVER), CDI_CLASS)
    driver = DraDriver(NeuronProfile(), node_name=NODE, cdi=cdi, store=store, inventory=inv)
    return driver, paths


async def bench_local(root: Path, iterations: int) -> list[float]:
    reader = DictReader()
    driver, paths = make_driver(root)
    plugin = DraPlugin(driver, paths, claims=ClaimReader(reader))
    reader.claims[("bench", "c")] = msgspec.convert(claim_dict("uid-local", "c"), ResourceClaim)
    ref = ClaimRef("bench", "uid-local", "c")

    def one() -> float:  # production's calls, from a worker thread as the DRA server makes them
        plugin.prepare([ref])
        seconds = driver.last_local_seconds
        plugin.unprepare([ref])
        return seconds

    return [await asyncio.to_thread(one) for _ in range(iterations)]


def create_allocated_claim(admin: Client, name: str) -> dict[str, Any]:
    claim = ResourceClaim.from_dict({
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"devices": {"requests": [{"name": "neurons", "exactly": {
            "deviceClassName": DRIVER, "allocationMode": "ExactCount", "count": 16}}]}}})
    created = admin.create(claim)  # type: ignore[call-overload]
    data: dict[str, Any] = created.to_dict()
    data["status"] = {"allocation": {"devices": {"results": [
        {"request": "neurons", "driver": DRIVER, "pool": NODE, "device": f"neuron-device-{i}"} for i in range(16)]},
        "nodeSelector": {"nodeSelectorTerms": [{"matchFields": [
            {"key": "metadata.name", "operator": "In", "values": [NODE]}]}]}}}
    updated = admin.replace(ResourceClaim.Status.from_dict(data), name)  # type: ignore[call-overload]
    out: dict[str, Any] = updated.to_dict()
    return out


async def bench_api_and_socket(cp: ControlPlane, root: Path, iterations: int) -> tuple[list[float], list[float],
                                                                                       list[float]]:
    admin = Client(KubeConfig.from_file(cp.admin_kubeconfig))
    claim = create_allocated_claim(admin, "bench-16")
    uid = claim["metadata"]["uid"]
    client = AsyncClient(KubeConfig.from_file(cp.admin_kubeconfig))
    direct = DirectClaimGet.from_config(kube_config(str(cp.admin_kubeconfig)), keepalive=API_KEEPALIVE_SECONDS)
    assert direct is not None
    reader = ClaimReader(direct)
    driver, paths = make_driver(root)
    await asyncio.to_thread(reader.read, "default", "bench-16")  # connection warm-up
    reads = []
    for _ in range(iterations):
        await asyncio.to_thread(reader.read, "default", "bench-16")
        reads.append(reader.last_seconds)
    plugin = DraPlugin(driver, paths, claims=reader)
    standin = KubeletStandIn(paths.kubelet_root)
    paths.plugins_registry_dir.mkdir(parents=True, exist_ok=True)
    await plugin.start()
    conn = await standin.register_dra(DRIVER)
    full, local = [], []
    for _ in range(iterations):
        start = time.perf_counter()
        resp: Any = await conn.prepare(("default", uid, "bench-16"))
        full.append(time.perf_counter() - start)
        assert resp[uid].error == "", resp[uid].error
        local.append(driver.last_local_seconds)
        await conn.unprepare(("default", uid, "bench-16"))
    await conn.close()
    await plugin.stop()
    await client.close()
    admin.delete(ResourceClaim, "bench-16", namespace="default")
    admin.close()
    return reads, full, local


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def writes_metric(port: int) -> float:
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith("accel_dra_resourceslice_writes_total{"))


def bench_process(cp: ControlPlane, root: Path, idle_seconds: float) -> None:
    cp.create_fake_node(NODE + "-proc")
    node = NODE + "-proc"
    host_root = root / "proc-host"
    build_host(host_root, "trn2.48xlarge")
    admin = Client(KubeConfig.from_file(cp.admin_kubeconfig))
    port = free_port()
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    log = (root / "driver.log").open("wb")
    start = time.perf_counter()
    proc = subprocess.Popen(
        [sys.executable, "-m", "neuron_dra.dra.cli", "serve", "--host-root", str(host_root), "--node-name", node,
         "--kubelet-root", str(root / "proc-kubelet"),
         "--device-plugins-dir", str(root / "proc-kubelet" / "device-plugins"), "--cdi-root", str(root / "proc-cdi"),
         "--kubeconfig", str(cp.admin_kubeconfig), "--metrics-port", str(port), "--metrics-address", "127.0.0.1",
         "--healthcheck-port", "-1"], env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        published = None
        while time.perf_counter() - start < 120:
            found = list(admin.list(ResourceSlice, fields={"spec.nodeName": node}))
            if found and len(found[0].spec.devices or []) == 16:
                published = time.perf_counter() - start
                break
            time.sleep(0.02)
        if published is None:
            print("start to slices published: did not publish within 120 s (see driver.log)")
            return
        print(f"start to slices published (process launch, imports, discovery, API): {published * 1000:.0f} ms")
        time.sleep(2)  # let the watch settle
        rv_before = found[0].metadata.resourceVersion  # type: ignore[union-attr]
        writes_before = writes_metric(port)
        time.sleep(idle_seconds)
        writes_after = writes_metric(port)
        rv_after = list(admin.list(ResourceSlice, fields={"spec.nodeName": node}))[0].metadata.resourceVersion  # type: ignore[union-attr]
        idle_writes = writes_after - writes_before
        per_10_min = idle_writes * 600 / idle_seconds
        print(f"API writes while idle: {idle_writes:.0f} in {idle_seconds:.0f} s (= {per_10_min:.1f} per 10 minutes); "
              f"total writes since start {writes_after:.0f}; slice resourceVersion "
              f"{'unchanged' if rv_before == rv_after else f'changed {rv_before} -> {rv_after}'}")
        rss = psutil.Process(proc.pid).memory_info().rss
        print(f"RSS of neuron-dra-driver serve after the idle window: {rss / 2**20:.1f} MiB")
    finally:
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(timeout=30)
        log.close()
        print(f"(driver exited with {code} on SIGTERM)")
        admin.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iterations", type=int, default=300)
    parser.add_argument("--idle-seconds", type=float, default=60.0)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="nd-bench-", dir="/tmp") as tmp:
        root = Path(tmp)
        local = asyncio.run(bench_local(root / "a", args.iterations))
        print(f"prepare 16 devices, handler without API read: {ms(local)}")
        if missing_binaries(kube_bin_dir()):
            print("Kubernetes binaries missing (scripts/build-kube.sh): API parts skipped")
            return 0
        with ControlPlane(root / "cp", with_controller_manager=False, with_scheduler=False) as cp:
            reads, full, local2 = asyncio.run(bench_api_and_socket(cp, root / "b", args.iterations))
            print(f"claim read from the API server: {ms(reads)}")
            print(f"prepare 16 devices through the DRA socket incl. API read: {ms(full)}")
            print(f"  of which without the API read: {ms(local2)}")
            bench_process(cp, root, args.idle_seconds)
    return 0


if __name__ == "__main__":
    sys.exit(main())
