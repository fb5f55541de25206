"""DRA drivers side by side: ``neuron-dra-driver serve`` (fake trn2.48xlarge) against the DRA test driver that
k8s.io/kubernetes ships for its e2e tests (``dra-test-driver kubelet-plugin``), both against one real
kube-apiserver, each under its own kubelet stand-in in this process; prepares interleaved driver by driver.

The Go driver runs with a client rate limit far above what the benchmark asks (``--kube-api-qps 1000``), so the
figures compare the work, not the limiter. Claims are created allocated (status written by the admin), one device
each; a batch is 8 such claims in one NodePrepareResources call.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from compare_common import Row, Table, console_script, cpu_seconds, free_port, p50, rss_mib
from lightkube import Client, KubeConfig
from lightkube.resources.resource_v1 import ResourceClaim, ResourceSlice

from accel_core.devtools.controlplane import ControlPlane
from accel_core.devtools.kubelet_standin import DraConnection, KubeletStandIn
from accel_core.fakehost import build_host

BATCH = 8


@dataclass
class Driver:
    name: str
    driver: str
    node: str
    device: str  #: device name pattern with ``{i}``
    argv: list[str] = field(default_factory=list)
    proc: asyncio.subprocess.Process | None = None
    standin: KubeletStandIn | None = None
    conn: DraConnection | None = None
    start_to_socket: float = 0.0
    start_to_slices: float = 0.0
    one: list[float] = field(default_factory=list)
    batch: list[float] = field(default_factory=list)
    claims: list[tuple[str, str, str]] = field(default_factory=list)


def allocated_claim(admin: Client, d: Driver, index: int) -> tuple[str, str, str]:
    name = f"{d.name}-{index}"
    claim = ResourceClaim.from_dict({
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"devices": {"requests": [{"name": "dev", "exactly": {
            "deviceClassName": d.driver, "allocationMode": "ExactCount", "count": 1}}]}}})
    created = admin.create(claim)  # type: ignore[call-overload]
    data: dict[str, Any] = created.to_dict()
    data["status"] = {"allocation": {"devices": {"results": [
        {"request": "dev", "driver": d.driver, "pool": d.node, "device": d.device.format(i=index)}]},
        "nodeSelector": {"nodeSelectorTerms": [{"matchFields": [
            {"key": "metadata.name", "operator": "In", "values": [d.node]}]}]}}}
    admin.replace(ResourceClaim.Status.from_dict(data), name)  # type: ignore[call-overload]
    return ("default", data["metadata"]["uid"], name)


def histogram_mean_ms(text: str, name: str) -> float:
    """Mean of a Prometheus histogram in a /metrics text (sum / count), in ms."""
    values = {}
    for line in text.splitlines():
        for suffix in ("_sum", "_count"):
            if line.startswith(name + suffix + " ") or line.startswith(name + suffix + "{"):
                values[suffix] = values.get(suffix, 0.0) + float(line.rsplit(" ", 1)[1])
    return 1e3 * values.get("_sum", 0.0) / values["_count"] if values.get("_count") else float("nan")


def prepare_split(port: int) -> tuple[float, float]:
    """Our driver's own split of a prepare: mean claim read, mean local part (its metrics)."""
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    prefix = "neuron_dra"
    names = [n.split("_claim_read_duration_seconds")[0] for n in text.split()
             if "_claim_read_duration_seconds_sum" in n]
    if names:
        prefix = names[0]
    return (histogram_mean_ms(text, f"{prefix}_claim_read_duration_seconds"),
            histogram_mean_ms(text, f"{prefix}_prepare_local_duration_seconds"))


def slice_devices(admin: Client, node: str, driver: str) -> int:
    return sum(len(s.spec.devices or []) for s in admin.list(ResourceSlice, fields={"spec.nodeName": node})
               if s.spec.driver == driver)


async def start(d: Driver, admin: Client, root: Path, want_devices: int) -> None:
    d.standin = KubeletStandIn(root / "kubelet")
    await d.standin.start()
    log = (root / f"{d.name}.log").open("wb")
    t0 = time.perf_counter()
    d.proc = await asyncio.create_subprocess_exec(*d.argv, stdout=log, stderr=log, cwd=root)
    try:
        d.conn = await d.standin.register_dra(d.driver, timeout=120)
    except TimeoutError:
        log.close()
        tail = (root / f"{d.name}.log").read_text(errors="replace").splitlines()[-15:]
        raise TimeoutError(f"{d.name} never offered its registration socket; its log ends:\n"
                           + "\n".join(tail)) from None
    d.start_to_socket = time.perf_counter() - t0
    while slice_devices(admin, d.node, d.driver) < want_devices:
        if time.perf_counter() - t0 > 120:
            raise TimeoutError(f"{d.name}: slices not published in 120 s (see {root / (d.name + '.log')})")
        await asyncio.sleep(0.01)
    d.start_to_slices = time.perf_counter() - t0


async def prepare(d: Driver, claims: list[tuple[str, str, str]], into: list[float]) -> None:
    assert d.conn is not None
    t0 = time.perf_counter()
    resp: Any = await d.conn.prepare(*claims)
    into.append(time.perf_counter() - t0)
    for _, uid, name in claims:
        if resp[uid].error:
            raise RuntimeError(f"{d.name}: prepare of {name} failed: {resp[uid].error}")
    await d.conn.unprepare(*claims)


async def stop(d: Driver) -> None:
    if d.conn is not None:
        await d.conn.close()
    if d.proc is not None and d.proc.returncode is None:
        d.proc.terminate()
        try:
            await asyncio.wait_for(d.proc.wait(), 20)
        except TimeoutError:
            d.proc.kill()
            await d.proc.wait()
    if d.standin is not None:
        await d.standin.stop()


async def run(root: Path, peers: Path, table: Table, *, iterations: int, idle: float) -> None:
    with ControlPlane(root / "cp", with_controller_manager=False, with_scheduler=False) as cp:
        admin = Client(KubeConfig.from_file(cp.admin_kubeconfig))
        host = build_host(root / "neuron-host", "trn2.48xlarge")
        ours = Driver("neuron", "neuron.aws.com", "cmp-neuron", "neuron-device-{i}")
        metrics_port = free_port()
        go = Driver("go", "test-driver.cdi.k8s.io", "cmp-go", "device-{i:02d}")
        k_ours, k_go = root / "neuron" / "kubelet", root / "go" / "kubelet"
        profile = os.environ.get("BENCH_PROFILE")  # cProfile output file for our driver (to see where time goes)
        prefix = [sys.executable, "-m", "cProfile", "-o", profile] if profile else []
        ours.argv = [*prefix, console_script("neuron-dra-driver"), "serve", "--host-root", str(host.root),
                     "--node-name", ours.node, "--kubelet-root", str(k_ours),
                     "--device-plugins-dir", str(k_ours / "device-plugins"), "--cdi-root", str(root / "neuron" / "cdi"),
                     "--kubeconfig", str(cp.admin_kubeconfig), "--metrics-port", str(metrics_port),
                     "--healthcheck-port", "-1", "--log-level", "WARNING"]
        go.argv = [str(peers / "dra-test-driver"), "--kubeconfig", str(cp.admin_kubeconfig),
                   "--kube-api-qps", "1000", "--kube-api-burst", "1000", "-v", "0", "kubelet-plugin",
                   "--node-name", go.node, "--plugin-registration-path", str(k_go / "plugins_registry"),
                   "--datadir", str(k_go / "plugins"), "--cdi-dir", str(root / "go" / "cdi"),
                   "--num-devices", "16"]
        drivers = (ours, go)
        (k_go / "plugins" / go.driver).mkdir(parents=True)  # it creates only the parent of its data directory
        try:
            for d in drivers:
                cp.create_fake_node(d.node)
                d.claims = [allocated_claim(admin, d, i) for i in range(BATCH)]
            for d in drivers:
                (root / d.name).mkdir(parents=True, exist_ok=True)
                await start(d, admin, root / d.name, 16)
            for d in drivers:  # warm-up: first connections, caches
                await prepare(d, d.claims[:1], [])
            for _ in range(iterations):
                for d in drivers:
                    await prepare(d, d.claims[:1], d.one)
            split_before = prepare_split(metrics_port)
            for _ in range(iterations):
                for d in drivers:
                    await prepare(d, d.claims, d.batch)
            await asyncio.sleep(2.0)
            before = {d.name: cpu_seconds(d.proc.pid) for d in drivers if d.proc}
            await asyncio.sleep(idle)
            idle_cpu = {d.name: cpu_seconds(d.proc.pid) - before[d.name] for d in drivers if d.proc}
            rss = {d.name: rss_mib(d.proc.pid) for d in drivers if d.proc}
        finally:
            for d in drivers:
                with contextlib.suppress(Exception):
                    await stop(d)
            admin.close()
        del host
    for figure, a, b, limit in (("DRA prepare 1 claim p50", p50(ours.one), p50(go.one), 1.5),
                                (f"DRA prepare batch of {BATCH} p50", p50(ours.batch), p50(go.batch), 1.5)):
        table.add(Row(figure, "ms", a * 1e3, b * 1e3, target=f"<={limit}x Go", met=a <= limit * b,
                      note=f"{iterations} interleaved rounds; through the DRA socket incl. the claim read"))
    read_ms, local_ms = split_before
    table.add(Row("  of ours (1 claim): claim read from the API, mean", "ms", read_ms))
    table.add(Row("  of ours (1 claim): config, 2 checkpoint writes, CDI spec, mean", "ms", local_ms))
    table.add(Row("DRA start->registration socket answers", "ms", ours.start_to_socket * 1e3,
                  go.start_to_socket * 1e3))
    table.add(Row("DRA start->slices published", "ms", ours.start_to_slices * 1e3, go.start_to_slices * 1e3))
    table.add(Row("idle CPU DRA driver", f"s/{idle:.0f}s", idle_cpu["neuron"], idle_cpu["go"],
                  target=f"<={0.05 * idle / 30:.3f} s", met=idle_cpu["neuron"] <= 0.05 * idle / 30))
    table.add(Row("RSS DRA driver", "MiB", rss["neuron"], rss["go"], target="<=1.5x Go",
                  met=rss["neuron"] <= 1.5 * rss["go"]))
