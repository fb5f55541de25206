"""DRA drivers side by side: ``neuron-dra-driver serve`` (fake trn2.48xlarge) against the DRA test driver that
k8s.io/kubernetes ships for its e2e tests (``dra-test-driver kubelet-plugin``), both against one real
kube-apiserver, each under its own kubelet stand-in in this process; prepares interleaved driver by driver.

The Go driver runs with a client rate limit far above what the benchmark asks (``--kube-api-qps 1000``), so the
figures compare the work, not the limiter. Per prepare it GETs each claim (one after another), writes one CDI spec
per request with a plain write (no temp file, no sync) and keeps what it prepared in memory only; ours also
records every request durably in its checkpoint (the split of our time per phase is printed under the figures).
A third figure prepares one claim after 7 s of quiet, as on a real node where prepares come far apart.
Claims are created allocated (status written by the admin), one device
each; a batch is 8 such claims in one NodePrepareResources call.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import statistics
import sys
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from accel_rig.controlplane import ControlPlane
from accel_rig.kubelet_standin import DraConnection, KubeletStandIn
from compare_common import Row, Table, Versus, cpu_seconds, daemon_argv, free_port, p50, rss_mib
from lightkube import Client, KubeConfig
from lightkube.resources.resource_v1 import ResourceClaim, ResourceSlice

from accel_core.fakehost import build_host

BATCH = 8
IDLE_ROUNDS = 6  #: a multiple of 2 and 3 drivers: each is first after the pause equally often
IDLE_BEFORE_PREPARE = 7.0  #: seconds; more than an HTTP client's usual 5 s keep-alive


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
    to_socket: list[float] = field(default_factory=list)
    to_slices: list[float] = field(default_factory=list)
    one: list[float] = field(default_factory=list)
    batch: list[float] = field(default_factory=list)
    after_idle: list[float] = field(default_factory=list)
    claims: list[tuple[str, str, str]] = field(default_factory=list)

    @property
    def start_to_socket(self) -> float:
        return statistics.median(self.to_socket)

    @property
    def start_to_slices(self) -> float:
        return statistics.median(self.to_slices)


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


PHASES = ("guard", "read", "plan", "cdi", "checkpoint")
#: phases before the plugin's serialized section (the claim reads, made before the locks): the handler's time
#: (``accel_dra_claim_operation_duration_seconds``, the time under the locks) does not include them
BEFORE_LOCKS = ("read",)


def histogram_sums(text: str) -> dict[str, float]:
    """Every ``*_sum`` and ``*_count`` sample of a Prometheus /metrics text, keyed by its line's name and labels."""
    out = {}
    for line in text.splitlines():
        if line.startswith("#") or " " not in line:
            continue
        key, value = line.rsplit(" ", 1)
        if "_sum" in key or "_count" in key:
            out[key] = float(value)
    return out


async def scrape(port: int) -> dict[str, float]:
    """Our driver's /metrics, fresh: its endpoint answers from a snapshot up to 2 s old, so wait that out first."""
    await asyncio.sleep(2.2)
    text = await asyncio.to_thread(
        lambda: urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode())
    return histogram_sums(text)


def phase_means_ms(before: dict[str, float], after: dict[str, float], requests: int) -> dict[str, float]:
    """Our driver's own split of the prepares between two scrapes: mean ms per request in each phase
    (``<prefix>_prepare_phase_duration_seconds{phase}``)."""
    out = {}
    for phase in PHASES:
        keys = [k for k in after if "_prepare_phase_duration_seconds_sum" in k and f'phase="{phase}"' in k]
        out[phase] = 1e3 * sum(after[k] - before.get(k, 0.0) for k in keys) / requests if keys else float("nan")
    return out


def handler_mean_ms(before: dict[str, float], after: dict[str, float]) -> float:
    """Mean ms per request inside the plugin's serialized section: every claim of a request observes the request's
    time there, so the mean per claim is the mean per request."""
    def total(suffix: str) -> float:
        keys = [k for k in after if k.startswith(f"accel_dra_claim_operation_duration_seconds_{suffix}")
                and 'operation="prepare"' in k]
        return sum(after[k] - before.get(k, 0.0) for k in keys)

    count = total("count")
    return 1e3 * total("sum") / count if count else float("nan")


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
    d.to_socket.append(time.perf_counter() - t0)
    while slice_devices(admin, d.node, d.driver) < want_devices:
        if time.perf_counter() - t0 > 120:
            raise TimeoutError(f"{d.name}: slices not published in 120 s (see {root / (d.name + '.log')})")
        await asyncio.sleep(0.01)
    d.to_slices.append(time.perf_counter() - t0)


async def restart(d: Driver, admin: Client, root: Path, want_devices: int) -> None:
    """Stop ``d``, delete its slices (as a node's drain would) and time its start again."""
    await stop(d)
    d.conn = d.proc = d.standin = None
    for s in admin.list(ResourceSlice, fields={"spec.nodeName": d.node}):
        if s.metadata and s.metadata.name:
            admin.delete(ResourceSlice, s.metadata.name)
    while slice_devices(admin, d.node, d.driver):
        await asyncio.sleep(0.01)
    await start(d, admin, root, want_devices)


def rotated(drivers: tuple[Driver, ...], turn: int) -> tuple[Driver, ...]:
    """``drivers`` starting at ``turn`` (mod their number): no driver is always the first after a pause."""
    k = turn % len(drivers)
    return drivers[k:] + drivers[:k]


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


def neuron_argv(tree: Path | None, host: Path, node: str, run: Path, kubeconfig: Path, metrics_port: int,
                prefix: list[str]) -> list[str]:
    """Our Neuron DRA driver (this checkout's, or a baseline ``tree``'s) for ``node``, under ``run``."""
    kubelet = run / "kubelet"
    return [*prefix, *daemon_argv("neuron-dra-driver", tree), "serve", "--host-root", str(host), "--node-name", node,
            "--kubelet-root", str(kubelet), "--device-plugins-dir", str(kubelet / "device-plugins"),
            "--cdi-root", str(run / "cdi"), "--kubeconfig", str(kubeconfig), "--metrics-port", str(metrics_port),
            "--healthcheck-port", "-1", "--log-level", "WARNING"]


async def run(root: Path, peers: Path, table: Table, *, iterations: int, idle: float, starts: int = 1,
              versus: tuple[Path, Versus] | None = None) -> None:
    """The DRA rows of ``table``; with ``versus`` (a baseline checkout and its table), our driver as of that
    checkout too, interleaved in the same rounds. Each driver starts ``starts`` times (median), in turn."""
    with ControlPlane(root / "cp", with_controller_manager=False, with_scheduler=False) as cp:
        admin = Client(KubeConfig.from_file(cp.admin_kubeconfig))
        host = build_host(root / "neuron-host", "trn2.48xlarge")
        ours = Driver("neuron", "neuron.aws.com", "cmp-neuron", "neuron-device-{i}")
        metrics_port = free_port()
        go = Driver("go", "test-driver.cdi.k8s.io", "cmp-go", "device-{i:02d}")
        k_go = root / "go" / "kubelet"
        profile = os.environ.get("BENCH_PROFILE")  # cProfile output file for our driver (to see where time goes)
        prefix = [sys.executable, "-m", "cProfile", "-o", profile] if profile else []
        ours.argv = neuron_argv(None, host.root, ours.node, root / "neuron", cp.admin_kubeconfig, metrics_port, prefix)
        go.argv = [str(peers / "dra-test-driver"), "--kubeconfig", str(cp.admin_kubeconfig),
                   "--kube-api-qps", "1000", "--kube-api-burst", "1000", "-v", "0", "kubelet-plugin",
                   "--node-name", go.node, "--plugin-registration-path", str(k_go / "plugins_registry"),
                   "--datadir", str(k_go / "plugins"), "--cdi-dir", str(root / "go" / "cdi"),
                   "--num-devices", "16"]
        drivers: tuple[Driver, ...] = (ours, go)
        if versus is not None:
            base = Driver("neuron-base", "neuron.aws.com", "cmp-neuron-base", "neuron-device-{i}")
            base.argv = neuron_argv(versus[0], host.root, base.node, root / base.name, cp.admin_kubeconfig,
                                    free_port(), [])
            drivers = (ours, go, base)
        (k_go / "plugins" / go.driver).mkdir(parents=True)  # it creates only the parent of its data directory
        try:
            for d in drivers:
                cp.create_fake_node(d.node)
                d.claims = [allocated_claim(admin, d, i) for i in range(BATCH)]
            for d in drivers:
                (root / d.name).mkdir(parents=True, exist_ok=True)
                await start(d, admin, root / d.name, 16)
            for turn in range(1, starts):
                for d in rotated(drivers, turn):
                    await restart(d, admin, root / d.name, 16)
            for d in drivers:  # warm-up: first connections, caches
                await prepare(d, d.claims[:1], [])
            scrapes = [await scrape(metrics_port)]
            for _ in range(iterations):
                for d in drivers:
                    await prepare(d, d.claims[:1], d.one)
            scrapes.append(await scrape(metrics_port))
            for _ in range(iterations):
                for d in drivers:
                    await prepare(d, d.claims, d.batch)
            scrapes.append(await scrape(metrics_port))
            for turn in range(IDLE_ROUNDS):  # as on a real node, where prepares come seconds to minutes apart
                await asyncio.sleep(IDLE_BEFORE_PREPARE)
                for d in rotated(drivers, turn):
                    await prepare(d, d.claims[:1], d.after_idle)
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
    if versus is not None:
        old, vs = drivers[2], versus[1]
        vs.add("DRA prepare 1 claim p50", "ms", p50(ours.one) * 1e3, p50(old.one) * 1e3)
        vs.add(f"DRA prepare batch of {BATCH} p50", "ms", p50(ours.batch) * 1e3, p50(old.batch) * 1e3)
        vs.add(f"DRA prepare 1 claim after {IDLE_BEFORE_PREPARE:.0f} s idle p50", "ms", p50(ours.after_idle) * 1e3,
               p50(old.after_idle) * 1e3)
        vs.add("DRA start->slices published", "ms", ours.start_to_slices * 1e3, old.start_to_slices * 1e3)
        vs.add("idle CPU DRA driver", f"s/{idle:.0f}s", idle_cpu["neuron"], idle_cpu[old.name])
        vs.add("RSS DRA driver", "MiB", rss["neuron"], rss[old.name])
    for figure, a, b, limit in (("DRA prepare 1 claim p50", p50(ours.one), p50(go.one), 1.5),
                                (f"DRA prepare batch of {BATCH} p50", p50(ours.batch), p50(go.batch), 1.5)):
        table.add(Row(figure, "ms", a * 1e3, b * 1e3, target=f"<={limit}x Go", met=a <= limit * b,
                      note=f"{iterations} interleaved rounds; through the DRA socket incl. the claim read"))
    table.add(Row(f"DRA prepare 1 claim after {IDLE_BEFORE_PREPARE:.0f} s idle, p50", "ms", p50(ours.after_idle) * 1e3,
                  p50(go.after_idle) * 1e3, note=f"{IDLE_ROUNDS} rounds; a new API connection unless kept alive"))
    labels = {"guard": "device-plugin guard (a directory listing, in the write thread)",
              "read": "claim read(s) from the API, at once",
              "plan": "config, edits, conflict checks",
              "cdi": "CDI spec write(s), not synced",
              "checkpoint": "checkpoint: 1 journal record per request (1 fdatasync)"}
    for what, times, (before, after) in (("1 claim", ours.one, scrapes[:2]), (f"batch of {BATCH}", ours.batch,
                                                                             scrapes[1:])):
        phases = phase_means_ms(before, after, len(times))
        total = 1e3 * sum(times) / len(times)
        table.add(Row(f"  of ours ({what}), mean: whole call as the client sees it", "ms", total))
        for phase in PHASES:
            table.add(Row(f"  of ours ({what}), mean: {labels[phase]}", "ms", phases[phase]))
        handler = handler_mean_ms(before, after)
        before_locks = sum(v for k, v in phases.items() if k in BEFORE_LOCKS)
        table.add(Row(f"  of ours ({what}), mean: thread hops, locks, logs under the locks", "ms",
                      handler - sum(v for k, v in phases.items() if k not in BEFORE_LOCKS)))
        table.add(Row(f"  of ours ({what}), mean: gRPC in/out (client and server), outside the reads and locks",
                      "ms", total - handler - before_locks))
    table.add(Row("DRA start->registration socket answers", "ms", ours.start_to_socket * 1e3,
                  go.start_to_socket * 1e3))
    table.add(Row("DRA start->slices published", "ms", ours.start_to_slices * 1e3, go.start_to_slices * 1e3,
                  note=f"median of {len(ours.to_slices)} starts, in turn"))
    table.add(Row("idle CPU DRA driver", f"s/{idle:.0f}s", idle_cpu["neuron"], idle_cpu["go"],
                  target=f"<={0.05 * idle / 30:.3f} s", met=idle_cpu["neuron"] <= 0.05 * idle / 30))
    table.add(Row("RSS DRA driver", "MiB", rss["neuron"], rss["go"], target="<=1.5x Go",
                  met=rss["neuron"] <= 1.5 * rss["go"]))
