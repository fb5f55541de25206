"""API load of N Neuron DRA drivers' slice publishers, in one real control plane (issue 23, item 4).

N kubelet-less trn2.48xlarge Nodes; for each, the driver's own ``SlicePublisher`` with its own API client (so its own
TLS connection and watch, as one ``neuron-dra-driver serve`` per node has), run as asyncio tasks in ``--procs``
worker processes (:mod:`fleet_publishers`). Phases, each measured from the API server's own metrics (requests and
bytes for resourceslices and nodes) and its CPU time (``/proc``):

- idle before: the control plane with its scheduler and controller-manager, no publishers (the baseline);
- install: every publisher starts at once with no slice there (a DaemonSet created on N nodes): GET its Node,
  LIST its slices, CREATE one, WATCH; converged when every publisher has published;
- idle: ``--idle`` seconds with N open watches;
- health: one device per node turns unhealthy at once (a fleet-wide event): one UPDATE per node;
- rollout: every publisher stops and a new one starts with a new ``draDriverVersion`` (a DaemonSet update with all
  pods replaced at once): GET, LIST, UPDATE, WATCH each;
- labels (``--label-watch on``): every Node gets a ``topology.k8s.aws/network-node-layer-1`` label (one PATCH per
  node, by the bench), and each driver's Node watch turns it into ``networkNodeLayer1`` on its devices (one UPDATE).

``--label-watch off,on`` runs each size twice in turn: without, then with each driver's watch on its own Node
(:class:`accel_core.dra.nodelabels.NodeLabelWatch`, the driver's one GET and WATCH of its Node).

How this differs from N processes: the publishers share ``--procs`` event loops and the client side's CPU (the
2 cores here), so time to converge is bounded by the clients, not the API server, and is an upper bound; each real
driver also starts a Python process (~1 s of CPU on its own node) and spreads its start over the rollout. Requests,
bytes and the API server's CPU per publisher are the same as N processes would cause.

    .venv/bin/python bench/bench_fleet_api.py --nodes 500,5000 [--procs 4] [--idle 30]
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import ssl
import sys
import tempfile
import time
import urllib.request
from multiprocessing.connection import Connection
from pathlib import Path

import psutil
from accel_rig.controlplane import ControlPlane
from accel_rig.kubeversions import kube_bin_dir, missing_binaries
from fleet_common import Clients, cpu_seconds, create_node, fleet_sizes, parallel, rss_gib
from fleet_publishers import worker
from lightkube.resources.core_v1 import Node
from lightkube.resources.resource_v1 import ResourceSlice

RESOURCES = ("resourceslices", "nodes")
#: counters summed over RESOURCES (watch events: as sent to each watcher)
SERIES = {"requests": "apiserver_request_total{", "bytes_in": "apiserver_request_body_size_bytes_sum{",
          "bytes_out": "apiserver_response_sizes_sum{", "watch_bytes": "apiserver_watch_events_sizes_sum{",
          "watch_events": "apiserver_watch_events_total{"}


def scrape(cp: ControlPlane) -> dict[str, float]:
    """The API server's counters for RESOURCES, summed, plus its and etcd's CPU seconds and open watches."""
    cert, key = cp.pki.client("admin")
    ctx = ssl.create_default_context(cafile=str(cp.ca_cert))
    ctx.load_cert_chain(str(cert), str(key))
    text = urllib.request.urlopen(f"{cp.server}/metrics", context=ctx, timeout=60).read().decode()
    out = dict.fromkeys([*SERIES, "watches"], 0.0)
    for line in text.splitlines():
        if not any(f'resource="{r}"' in line for r in RESOURCES):
            continue
        for name, prefix in SERIES.items():
            if line.startswith(prefix):
                out[name] += float(line.rsplit(" ", 1)[1])
        if line.startswith("apiserver_longrunning_requests{") and 'verb="WATCH"' in line:
            out["watches"] += float(line.rsplit(" ", 1)[1])
    pids = cp.pids()
    out["cpu_apiserver"] = cpu_seconds(pids["kube-apiserver"])
    out["cpu_etcd"] = cpu_seconds(pids["etcd"])
    out["rss_apiserver"] = psutil.Process(pids["kube-apiserver"]).memory_info().rss
    return out


def report(phase: str, n: int, before: dict[str, float], after: dict[str, float], seconds: float,
           client_rss: float, rss0: float) -> None:
    d = {k: after[k] - before[k] for k in before}
    print(f"  {n} {phase:12s} {seconds:6.1f} s; requests {d['requests']:7.0f} ({d['requests'] / n:4.1f}/node); "
          f"in {d['bytes_in'] / 2**20:6.1f} MiB, read responses {d['bytes_out'] / 2**20:6.1f} MiB, watch events "
          f"{d['watch_events']:6.0f} / {d['watch_bytes'] / 2**20:6.1f} MiB; CPU apiserver {d['cpu_apiserver']:5.1f} s, "
          f"etcd {d['cpu_etcd']:5.1f} s; watches open {after['watches']:5.0f}; apiserver RSS "
          f"{after['rss_apiserver'] / 2**30:.2f} GiB; workers RSS {client_rss / 2**20:6.0f} MiB "
          f"({(client_rss - rss0) / n / 2**10:4.0f} KiB per publisher)", flush=True)


def command(conns: list[Connection], what: str) -> tuple[float, float]:
    """Send ``what`` to every worker; seconds until the last answered, and the workers' RSS in total."""
    t0 = time.perf_counter()
    for conn in conns:
        conn.send(what)
    answers = [conn.recv() for conn in conns]
    return time.perf_counter() - t0, float(sum(rss for _, rss in answers))


def label_nodes(clients: Clients, nodes: list[str], value: str | None) -> None:
    """Set (None: remove) every Node's network-node-layer-1 label, in parallel."""
    labels = {"topology.k8s.aws/network-node-layer-1": value}
    parallel(lambda name: clients.get().patch(Node, name, {"metadata": {"labels": labels}}), nodes)


def run_size(cp: ControlPlane, clients: Clients, nodes: list[str], procs: int, idle: float,
             label_watch: bool = False) -> None:
    n = len(nodes)
    ctx = multiprocessing.get_context("spawn")
    pipes = [ctx.Pipe() for _ in range(procs)]
    workers = [ctx.Process(target=worker, args=(child, str(cp.admin_kubeconfig), nodes[i::procs], label_watch),
                           daemon=True)
               for i, (_, child) in enumerate(pipes)]
    for w in workers:
        w.start()
    conns = [parent for parent, _ in pipes]
    rss0 = float(sum(conn.recv()[1] for conn in conns))  # each worker is ready: imports done, devices scanned
    base = scrape(cp)
    time.sleep(idle)
    after = scrape(cp)
    report("idle before", n, base, after, idle, rss0, rss0)
    phases = [("install", "start"), ("idle", None), ("health", "health"), ("rollout", "rollout")]
    if label_watch:
        phases.append(("labels", "labels"))
    rss = 0.0
    for phase, cmd in phases:
        before = scrape(cp)
        t0 = time.perf_counter()
        if cmd is None:
            time.sleep(idle)
            seconds = idle
        else:
            if cmd == "labels":
                label_nodes(clients, nodes, "nn-bench")
            seconds, rss = command(conns, cmd)
            seconds = time.perf_counter() - t0
        report(phase, n, before, scrape(cp), seconds, rss, rss0)
        if phase == "install":
            have = {s.spec.nodeName for s in clients.get().list(ResourceSlice) if s.spec and s.spec.devices}
            print(f"  {n} install: {len(have & set(nodes))}/{n} nodes have their slice", flush=True)
    command(conns, "stop")
    for w in workers:
        w.join(30)
    names = [s.metadata.name for s in clients.get().list(ResourceSlice) if s.metadata and s.metadata.name]
    parallel(lambda name: clients.get().delete(ResourceSlice, name), names)
    if label_watch:
        label_nodes(clients, nodes, None)


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--nodes", default="100", help="fleet sizes, comma-separated, grown in place (500,5000)")
    parser.add_argument("--procs", type=int, default=4, help="worker processes the publishers are spread over")
    parser.add_argument("--idle", type=float, default=30.0, help="seconds of each idle window")
    parser.add_argument("--label-watch", default="off", help="off, on or off,on: drivers without/with their Node watch")
    args = parser.parse_args()
    sizes = fleet_sizes(parser, args.nodes)
    if missing_binaries(kube_bin_dir()):
        print("Kubernetes binaries missing (scripts/build-kube.sh): nothing to measure")
        return 0
    with tempfile.TemporaryDirectory(prefix="fleet-api-", dir="/tmp") as tmp, ControlPlane(Path(tmp) / "cp") as cp:
        clients = Clients(cp.admin_kubeconfig)
        nodes: list[str] = []
        for size in sizes:
            new = [f"trn2-{i:05d}" for i in range(len(nodes), size)]
            t_nodes = parallel(lambda name: create_node(clients, name, "trn2.48xlarge", int(name[-5:])), new)
            nodes += new
            print(f"{size} trn2.48xlarge nodes ({len(new)} created in {t_nodes:.1f} s), publishers in {args.procs} "
                  f"processes", flush=True)
            for variant in args.label_watch.split(","):
                print(f"  label watch {variant}", flush=True)
                run_size(cp, clients, nodes, args.procs, args.idle, label_watch=variant == "on")
            print(f"  {size} nodes: RSS GiB: {rss_gib(cp)}; load average "
                  f"{', '.join(f'{x:.2f}' for x in os.getloadavg())}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
