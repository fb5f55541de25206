"""Device plugins side by side: ours (EFA on a fake p5.48xlarge, Neuron on a fake trn2.48xlarge) against the
Kubernetes sample device plugin, a no-op Go plugin and a no-op Python plugin, all under one client (a kubelet
stand-in per plugin in this one process), calls interleaved plugin by plugin.

The sample plugin registers only at the fixed ``/var/lib/kubelet/device-plugins/kubelet.sock``: it runs in a
private mount namespace (``unshare --mount``) where a temp directory is bound over ``/var/lib`` and a tmpfs over
``/tmp`` (its Allocate creates files there), so nothing on the machine's real paths is touched.
"""

from __future__ import annotations

import asyncio
import contextlib
import shlex
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from accel_rig.kubelet_standin import KubeletStandIn
from compare_common import REPO, Row, Table, Versus, cpu_seconds, daemon_argv, free_port, p50, rss_mib

from accel_core.fakehost import FakeHost, build_host
from accel_core.kubeletapi import deviceplugin_v1beta1_pb2 as dp

EFA = "vpc.amazonaws.com/efa"
NEURON = "aws.amazon.com/neuron"


@dataclass
class Plugin:
    """One device-plugin process under its own kubelet stand-in."""

    name: str
    resource: str
    make_argv: Callable[[KubeletStandIn, Path], list[str]]
    kubelet_root: Callable[[Path], Path] = lambda run: run / "kubelet"
    pref_size: int = 4
    starts: list[float] = field(default_factory=list)
    alloc: list[float] = field(default_factory=list)
    pref: list[float] = field(default_factory=list)
    proc: asyncio.subprocess.Process | None = None
    standin: KubeletStandIn | None = None
    ids: list[str] = field(default_factory=list)

    async def start(self, run: Path) -> float:
        """Spawn under a fresh stand-in; seconds from spawn until the stand-in has the Register call."""
        run.mkdir(parents=True, exist_ok=True)
        self.standin = KubeletStandIn(self.kubelet_root(run))
        await self.standin.start(pod_resources=True)
        argv = self.make_argv(self.standin, run)
        log = (run / f"{self.name}.log").open("wb")
        t0 = time.perf_counter()
        self.proc = await asyncio.create_subprocess_exec(*argv, stdout=log, stderr=log, cwd=run)
        await self.standin.wait_registered(self.resource, timeout=120)
        took = time.perf_counter() - t0
        self.starts.append(took)
        devices = await self.standin.wait_devices(self.resource, lambda d: len(d) > 0, timeout=30)
        self.ids = [d.ID for d in devices]
        return took

    async def stop(self) -> None:
        if self.proc is not None and self.proc.returncode is None:
            self.proc.terminate()
            try:
                await asyncio.wait_for(self.proc.wait(), 20)
            except TimeoutError:
                self.proc.kill()
                await self.proc.wait()
        if self.standin is not None:
            await self.standin.stop()
        self.proc = self.standin = None

    async def call_allocate(self) -> None:
        assert self.standin is not None
        t0 = time.perf_counter()
        await self.standin.allocate(self.resource, self.ids[:1])
        self.alloc.append(time.perf_counter() - t0)

    async def call_preferred(self) -> None:
        assert self.standin is not None
        size = min(self.pref_size, len(self.ids))
        request = dp.PreferredAllocationRequest(container_requests=[dp.ContainerPreferredAllocationRequest(
            available_deviceIDs=self.ids, allocation_size=size)])
        stub = self.standin.plugins[self.resource].stub
        t0 = time.perf_counter()
        await stub.GetPreferredAllocation(request)  # the sample plugin answers with no container responses
        self.pref.append(time.perf_counter() - t0)


def plugins(peers: Path, efa_host: Path, neuron_host: Path, baseline: Path | None = None) -> list[Plugin]:
    """Ours, the Go sample, the floors, and, with a ``baseline`` checkout, ours as of that checkout."""
    py = sys.executable
    floor_script = str(REPO / "bench" / "peers" / "floor_plugin.py")

    def ours(daemon: str, host: Path, tree: Path | None = None) -> Callable[[KubeletStandIn, Path], list[str]]:
        return lambda s, run: [*daemon_argv(daemon, tree), "serve", "--host-root", str(host), *s.daemon_flags(),
                               "--metrics-port", str(free_port()), "--log-level", "WARNING"]

    def sample(s: KubeletStandIn, run: Path) -> list[str]:
        var_lib = run / "var-lib"
        script = (f"mount --bind {shlex.quote(str(var_lib))} /var/lib && mount -t tmpfs tmpfs /tmp && "
                  f"exec {shlex.quote(str(peers / 'sample-device-plugin'))}")
        return ["unshare", "--mount", "--propagation", "private", "--", "/bin/sh", "-c", script]

    base = [] if baseline is None else [
        Plugin("efa-base", EFA, ours("efa-device-plugin", efa_host, baseline)),
        Plugin("neuron-base", NEURON, ours("neuron-device-plugin", neuron_host, baseline))]
    return [*base,
        Plugin("efa", EFA, ours("efa-device-plugin", efa_host)),
        Plugin("neuron", NEURON, ours("neuron-device-plugin", neuron_host)),
        Plugin("go-sample", "example.com/resource", sample, kubelet_root=lambda run: run / "var-lib" / "kubelet",
               pref_size=1),
        Plugin("go-floor", "example.com/noop",
               lambda s, run: [str(peers / "noopplugin"), "-socket", str(s.dp_dir / "noop.sock"),
                               "-kubelet", str(s.dp_dir / "kubelet.sock"), "-resource", "example.com/noop"]),
        Plugin("py-floor", "example.com/floor",
               lambda s, run: [py, floor_script, "--socket", str(s.dp_dir / "floor.sock"),
                               "--kubelet", str(s.dp_dir / "kubelet.sock")]),
    ]


async def health_latency(plugin: Plugin, flip: Callable[[int], None], restore: Callable[[int], None] | None,
                         rounds: int, device_id: Callable[[int], str]) -> list[float]:
    """Seconds from a health file changing on the host until the stand-in's ListAndWatch shows the device
    Unhealthy."""
    assert plugin.standin is not None
    out = []
    for i in range(rounds):
        want = device_id(i)
        flip(i)
        t0 = time.perf_counter()
        await plugin.standin.wait_devices(
            plugin.resource, lambda d, w=want: any(w == x.ID and x.health == "Unhealthy" for x in d), timeout=30)
        out.append(time.perf_counter() - t0)
        if restore is not None:
            restore(i)
            await plugin.standin.wait_devices(
                plugin.resource, lambda d, w=want: any(w == x.ID and x.health == "Healthy" for x in d), timeout=30)
    return out


async def cpu_over(subjects: list[Plugin], seconds: float) -> dict[str, float]:
    """CPU seconds each running plugin used over one shared window."""
    before = {p.name: cpu_seconds(p.proc.pid) for p in subjects if p.proc}
    await asyncio.sleep(seconds)
    return {p.name: cpu_seconds(p.proc.pid) - before[p.name] for p in subjects if p.proc}


async def run(root: Path, peers: Path, table: Table, *, calls: int, starts: int, idle: float,
              versus: tuple[Path, Versus] | None = None) -> None:
    """The device-plugin rows of ``table``; with ``versus`` (a baseline checkout and its table), ours against it too,
    interleaved in the same rounds."""
    efa_fake: FakeHost = build_host(root / "efa-host", "p5.48xlarge")
    neuron_fake: FakeHost = build_host(root / "neuron-host", "trn2.48xlarge")
    subjects = plugins(peers, efa_fake.root, neuron_fake.root, versus[0] if versus else None)
    by = {p.name: p for p in subjects}
    try:
        for rep in range(starts):  # interleaved: one start of each, then the next round
            for p in subjects:
                await p.start(root / f"{p.name}-{rep}")
                if rep < starts - 1:
                    await p.stop()
        await asyncio.sleep(3.0)  # start-up work done (first rescans, the deferred Node-label task)
        idle_cpu = await cpu_over(subjects, idle)  # an idle node: nothing allocated
        for _ in range(calls):
            for p in subjects:
                await p.call_allocate()
                await p.call_preferred()
        await asyncio.sleep(2.0)  # let the Allocate bookkeeping settle before the second window
        held_cpu = await cpu_over(subjects, idle)  # devices held (unconfirmed Allocates: the fast PodResources pace)
        rss = {p.name: rss_mib(p.proc.pid) for p in subjects if p.proc}

        ibdevs = efa_fake.efa_ibdevs
        efa_ids = by["efa"].ids
        efa_health = await health_latency(
            by["efa"], lambda i: efa_fake.set_port_state(ibdevs[i], "DOWN"),
            lambda i: efa_fake.set_port_state(ibdevs[i], "ACTIVE"), 5, lambda i: efa_ids[i])
        neuron_health = await health_latency(
            by["neuron"], lambda i: neuron_fake.set_neuron_counter(i, "stats/hardware/mem_ecc_uncorrected/total", 1),
            None, 5, str)
        if versus is not None:
            efa_base = await health_latency(
                by["efa-base"], lambda i: efa_fake.set_port_state(ibdevs[i], "DOWN"),
                lambda i: efa_fake.set_port_state(ibdevs[i], "ACTIVE"), 5, lambda i: by["efa-base"].ids[i])
    finally:
        for p in subjects:
            with contextlib.suppress(Exception):
                await p.stop()

    sample, gof, pyf = by["go-sample"], by["go-floor"], by["py-floor"]
    if versus is not None:
        vs = versus[1]
        for name in ("efa", "neuron"):
            new, old = by[name], by[f"{name}-base"]
            vs.add(f"start->Register {name} p50", "ms", p50(new.starts) * 1e3, p50(old.starts) * 1e3)
            vs.add(f"Allocate {name} p50", "ms", p50(new.alloc) * 1e3, p50(old.alloc) * 1e3)
            vs.add(f"GetPreferredAllocation {name} p50", "ms", p50(new.pref) * 1e3, p50(old.pref) * 1e3)
            vs.add(f"idle CPU {name}", f"s/{idle:.0f}s", idle_cpu[name], idle_cpu[f"{name}-base"])
            vs.add(f"CPU with devices held {name}", f"s/{idle:.0f}s", held_cpu[name], held_cpu[f"{name}-base"])
            vs.add(f"RSS {name}", "MiB", rss[name], rss[f"{name}-base"])
        vs.add("health change->ListAndWatch efa (max of 5)", "ms", max(efa_health) * 1e3, max(efa_base) * 1e3)
    for name in ("efa", "neuron"):
        p = by[name]
        start_limit = 1.3 * p50(pyf.starts)
        table.add(Row(f"start->Register {name}", "ms", p50(p.starts) * 1e3, p50(sample.starts) * 1e3,
                      p50(pyf.starts) * 1e3, p50(gof.starts) * 1e3, "<=1.3x Py floor",
                      p50(p.starts) <= start_limit, f"p50 of {starts} starts each, interleaved"))
        for figure, values, peer, pf, gf in (("Allocate p50", p.alloc, sample.alloc, pyf.alloc, gof.alloc),
                                             ("GetPreferredAllocation p50", p.pref, sample.pref, pyf.pref, gof.pref)):
            ours_ms = p50(values) * 1e3
            table.add(Row(f"{figure} {name}", "ms", ours_ms, p50(peer) * 1e3, p50(pf) * 1e3, p50(gf) * 1e3,
                          "<=0.2 ms above Py floor", ours_ms - p50(pf) * 1e3 <= 0.2))
        table.add(Row(f"idle CPU {name}", f"s/{idle:.0f}s", idle_cpu[name], idle_cpu["go-sample"],
                      idle_cpu["py-floor"], idle_cpu["go-floor"], f"<={0.05 * idle / 30:.3f} s",
                      idle_cpu[name] <= 0.05 * idle / 30, "running, registered, nothing allocated"))
        table.add(Row(f"CPU with devices held {name}", f"s/{idle:.0f}s", held_cpu[name], held_cpu["go-sample"],
                      held_cpu["py-floor"], held_cpu["go-floor"], "-", None,
                      "after the Allocates: what a node with running pods pays"))
        table.add(Row(f"RSS {name}", "MiB", rss[name], rss["go-sample"], rss["py-floor"], rss["go-floor"],
                      "<=1.5x Go or Py floor", rss[name] <= max(1.5 * rss["go-sample"], rss["py-floor"] * 1.5),
                      "after the calls and the idle window"))
    for name, values in (("efa", efa_health), ("neuron", neuron_health)):
        table.add(Row(f"health change->ListAndWatch {name} (max of {len(values)})", "ms", max(values) * 1e3,
                      target="<=1000 ms", met=max(values) <= 1.0,
                      note="fake host: the file change also raises an inotify event; on real sysfs the health "
                           "poll interval bounds it"))
