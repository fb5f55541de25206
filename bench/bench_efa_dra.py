"""EFA DRA driver figures, and what the DRA core seam costs a driver.

1. Prepare of a 1-device and a 16-device EFA claim (p5.48xlarge fake host, 32 EFAs): through the DRA socket
   including the claim read from a real kube-apiserver (kubelet stand-in -> gRPC -> handler -> API read -> fsync'd
   checkpoint and CDI spec), and the handler's part without the API read. p50/p99 over --iterations.
2. Start to slices published: ``efa-dra-driver serve`` launched as a process until its 32 devices are in the API.
3. RSS of that process after --idle-seconds (default 10).
4. Lines of the Neuron and the EFA profile (each driver's code besides discovery), and what a third accelerator
   costs: the made-up one's package lines and every file outside it its addition changed
   (scripts/count-accelerator.sh).

Parts 1 and 2 need the Kubernetes binaries (scripts/build-kube.sh); without them only part 4 runs.

    PYTHONPATH=. .venv/bin/python bench/bench_efa_dra.py [--iterations 300] [--idle-seconds 10]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

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
from accel_core.fakehost import build_host
from accel_core.paths import HostPaths
from efa_plugin.dra.profile import EfaProfile

REPO = Path(__file__).resolve().parents[1]
NODE = "bench-node"
DRIVER = "efa.aws.com"
# p5.48xlarge EFA device names (PCI buses 4f..52, 60..63, ... per efa.md 2.2), the first 16
P5_BUSES = ["4f", "50", "51", "52", "60", "61", "62", "63", "71", "72", "73", "74", "82", "83", "84", "85"]


def pct(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(p / 100 * (len(ordered) - 1))))]


def ms(values: list[float]) -> str:
    return (f"p50 {pct(values, 50) * 1000:.2f} ms, p99 {pct(values, 99) * 1000:.2f} ms, "
            f"max {max(values) * 1000:.2f} ms (n={len(values)})")


def create_allocated_claim(admin: Client, name: str, count: int) -> dict[str, Any]:
    claim = ResourceClaim.from_dict({
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"devices": {"requests": [{"name": "efa", "exactly": {
            "deviceClassName": "efa.networking.k8s.aws", "allocationMode": "ExactCount", "count": count}}]}}})
    data: dict[str, Any] = admin.create(claim).to_dict()  # type: ignore[call-overload]
    data["status"] = {"allocation": {"devices": {"results": [
        {"request": "efa", "driver": DRIVER, "pool": NODE, "device": f"efa-0000-{bus}-00-0"}
        for bus in P5_BUSES[:count]]},
        "nodeSelector": {"nodeSelectorTerms": [{"matchFields": [
            {"key": "metadata.name", "operator": "In", "values": [NODE]}]}]}}}
    out: dict[str, Any] = admin.replace(ResourceClaim.Status.from_dict(data), name).to_dict()  # type: ignore[call-overload]
    return out


async def bench_prepare(cp: ControlPlane, root: Path, iterations: int) -> None:
    paths = HostPaths(host_root=root / "host", kubelet_root=root / "kubelet", cdi_root=root / "cdi",
                      device_plugins=root / "kubelet" / "device-plugins")
    build_host(paths.host_root, "p5.48xlarge")
    admin = Client(KubeConfig.from_file(cp.admin_kubeconfig))
    claims = {count: create_allocated_claim(admin, f"efa-{count}", count) for count in (1, 16)}
    client = AsyncClient(KubeConfig.from_file(cp.admin_kubeconfig))
    profile = EfaProfile()
    scan = profile.scan(paths, "0.1.0")
    store = ClaimStore(paths.plugins_data_dir / DRIVER / "checkpoint.json", read_boot_id(paths.host_root))
    store.load()
    direct = DirectClaimGet.from_config(kube_config(str(cp.admin_kubeconfig)), keepalive=API_KEEPALIVE_SECONDS)
    assert direct is not None
    driver = DraDriver(profile, node_name=NODE, cdi=CdiSpecWriter(paths.cdi_root, cdi_vendor(DRIVER), CDI_CLASS),
                       store=store, inventory=scan.inventory)
    plugin = DraPlugin(driver, paths, claims=ClaimReader(direct))
    paths.plugins_registry_dir.mkdir(parents=True, exist_ok=True)
    await plugin.start()
    conn = await KubeletStandIn(paths.kubelet_root).register_dra(DRIVER)
    for count, claim in claims.items():
        ref = ("default", claim["metadata"]["uid"], claim["metadata"]["name"])
        full, local = [], []
        for _ in range(iterations):
            start = time.perf_counter()
            resp: Any = await conn.prepare(ref)
            full.append(time.perf_counter() - start)
            assert resp[ref[1]].error == "", resp[ref[1]].error
            assert len(resp[ref[1]].devices) == count
            local.append(driver.last_local_seconds)
            await conn.unprepare(ref)
        print(f"EFA prepare {count:2d} device(s) through the DRA socket incl. API read: {ms(full)}")
        print(f"  of which without the API read (config, CDI spec, one synced journal record): {ms(local)}")
    await conn.close()
    await plugin.stop()
    await client.close()
    for count in claims:
        admin.delete(ResourceClaim, f"efa-{count}", namespace="default")
    admin.close()


def bench_process(cp: ControlPlane, root: Path, idle_seconds: float) -> None:
    node = NODE + "-proc"
    cp.create_fake_node(node)
    host_root = root / "proc-host"
    build_host(host_root, "p5.48xlarge")
    admin = Client(KubeConfig.from_file(cp.admin_kubeconfig))
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    log = (root / "driver.log").open("wb")
    start = time.perf_counter()
    proc = subprocess.Popen(
        [sys.executable, "-m", "efa_plugin.dra.cli", "serve", "--host-root", str(host_root), "--node-name", node,
         "--kubelet-root", str(root / "proc-kubelet"),
         "--device-plugins-dir", str(root / "proc-kubelet" / "device-plugins"), "--cdi-root", str(root / "proc-cdi"),
         "--kubeconfig", str(cp.admin_kubeconfig), "--metrics-port", "0", "--healthcheck-port", "-1"],
        env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        published = None
        while time.perf_counter() - start < 120:
            found = list(admin.list(ResourceSlice, fields={"spec.nodeName": node}))
            if found and len(found[0].spec.devices or []) == 32:
                published = time.perf_counter() - start
                break
            time.sleep(0.02)
        if published is None:
            print("start to slices published: did not publish within 120 s (see driver.log)")
            return
        print(f"EFA start to slices published (process launch, imports, discovery, API): {published * 1000:.0f} ms")
        time.sleep(idle_seconds)
        rss = psutil.Process(proc.pid).memory_info().rss
        print(f"RSS of efa-dra-driver serve after {idle_seconds:.0f} s: {rss / 2**20:.1f} MiB")
    finally:
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(timeout=30)
        log.close()
        print(f"(driver exited with {code} on SIGTERM)")
        admin.close()


def lines(path: Path) -> int:
    return len(path.read_text().splitlines())


def seam_figures() -> None:
    for name, package, rule in (("Neuron", "neuron_dra/dra", "neuron_dra/health_rule.py"),
                                ("EFA", "efa_plugin/dra", "efa_plugin/health_rule.py")):
        files = sorted((REPO / package).glob("*.py"))
        total = sum(lines(f) for f in files)
        detail = ", ".join(f"{f.name} {lines(f)}" for f in files)
        print(f"{name} DRA profile: {total} lines besides discovery ({package}: {detail}); "
              f"its health rule, shared with the device plugin: {rule} {lines(REPO / rule)}")
    core = sorted((REPO / "accel_core/dra").glob("*.py"))
    print(f"generic DRA core: {sum(lines(f) for f in core)} lines in accel_core/dra ({len(core)} files)")
    # What a third accelerator costs, measured on the made-up one the tests carry (tests/sample_accelerator):
    # its package's lines and every file outside it that changed when it was added (scripts/count-accelerator.sh).
    out = subprocess.run(["bash", str(REPO / "scripts/count-accelerator.sh")], capture_output=True, text=True,
                         check=False, timeout=60)
    print("a third accelerator (scripts/count-accelerator.sh):")
    print(out.stdout.rstrip() if out.returncode == 0 else f"  (count failed: {out.stderr.strip()})")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iterations", type=int, default=300)
    parser.add_argument("--idle-seconds", type=float, default=10.0)
    args = parser.parse_args()
    seam_figures()
    if missing_binaries(kube_bin_dir()):
        print("Kubernetes binaries missing (scripts/build-kube.sh): API parts skipped")
        return 0
    with tempfile.TemporaryDirectory(prefix="efa-dra-bench-", dir="/tmp") as tmp:
        root = Path(tmp)
        with ControlPlane(root / "cp", with_controller_manager=False, with_scheduler=False) as cp:
            asyncio.run(bench_prepare(cp, root / "a", args.iterations))
            bench_process(cp, root, args.idle_seconds)
    return 0


if __name__ == "__main__":
    sys.exit(main())
