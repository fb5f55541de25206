"""The device-plugin path at fleet scale: N kubelet-less trn2.48xlarge Nodes (16 ``aws.amazon.com/neuron``, 64
``aws.amazon.com/neuroncore`` allocatable) each with a device-usage annotation from a random realistic history
(as bench_extender.py makes them), and ``--pods`` pods asking for ``aws.amazon.com/neuron: 4`` created at once.

Run 1: the default scheduler (counts only). Run 2: ``my-scheduler``, the real kube-scheduler with the Neuron
chart's KubeSchedulerConfiguration, calling the real ``neuron-scheduler-extender serve`` over the chart's mutual
TLS (started as tests/e2e/test_scheduler_extender_e2e.py does). Prints pods/s, create -> PodScheduled p50/p99,
the scheduler's CPU ms per pod, and the extender's filter and prioritize p50/p99 from its own latency histogram
(interpolated within the histogram's buckets).

    .venv/bin/python bench/bench_fleet_extender.py --nodes 500 --pods 200
"""

from __future__ import annotations

import argparse
import os
import random
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parent.parent
sys.path[1:1] = [str(REPO / "tests" / "e2e"), str(REPO / "tests")]  # the e2e test's chart TLS helpers

from accel_rig.controlplane import ControlPlane  # noqa: E402
from accel_rig.kubeversions import kube_bin_dir, missing_binaries  # noqa: E402
from bench_extender import _random_state  # noqa: E402
from chart_render import NEURON_CHART, find_or_build_helm, template  # noqa: E402
from compare_common import console_script, rss_mib  # noqa: E402
from fleet_common import Clients, create_node, delete_pods, fresh_namespace, parallel, rss_gib, time_pods  # noqa: E402
from test_scheduler_extender_e2e import chart_tls, scheduler_config  # noqa: E402

from neuron_dra.usage_annotation import USAGE_ANNOTATION, DeviceUsage  # noqa: E402

NEURON = "aws.amazon.com/neuron"
NEURONCORE = "aws.amazon.com/neuroncore"
INSTANCE = "trn2.48xlarge"
CORES_PER_DEVICE = 4  # trn2 at LNC 2


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def usage_annotation(rng: random.Random) -> str:
    state = _random_state(rng, CORES_PER_DEVICE)
    return DeviceUsage("torus4x4", 16, state.cores_per_device, state.used_devices, state.used_cores,
                       instance_type=INSTANCE, generation=1).to_json()


def pod(name: str, scheduler: str | None) -> dict[str, Any]:
    spec: dict[str, Any] = {"terminationGracePeriodSeconds": 0, "containers": [
        {"name": "c", "image": "busybox", "resources": {"limits": {NEURON: "4"}}}]}
    if scheduler:
        spec["schedulerName"] = scheduler
    return {"metadata": {"name": name}, "spec": spec}


def histogram_quantiles(text: str, metric: str, verb: str, qs: tuple[float, ...]) -> list[float]:
    """Quantiles (ms) of a Prometheus histogram, linear within the bucket that holds each."""
    buckets: list[tuple[float, float]] = []
    for line in text.splitlines():
        if line.startswith(f"{metric}_bucket{{") and f'verb="{verb}"' in line:
            bound = line.split('le="', 1)[1].split('"', 1)[0]
            buckets.append((float("inf") if bound == "+Inf" else float(bound), float(line.rsplit(" ", 1)[1])))
    buckets.sort()
    total = buckets[-1][1] if buckets else 0.0
    out = []
    for q in qs:
        want, lo, below = q * total, 0.0, 0.0
        value = float("nan")
        for le, count in buckets:
            if count >= want and total:
                hi = le if le != float("inf") else lo
                value = (lo + (hi - lo) * ((want - below) / max(count - below, 1e-9))) * 1e3
                break
            lo, below = le, count
        out.append(value)
    return out


def wait_port(port: int, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.2)
    raise TimeoutError(f"nothing listens on 127.0.0.1:{port} after {timeout:.0f} s")


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=100)
    parser.add_argument("--pods", type=int, default=200)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--client-qps", type=int, default=500, help="schedulers'/controller-manager's API QPS")
    parser.add_argument("--timeout", type=float, default=300.0)
    args = parser.parse_args()
    if missing_binaries(kube_bin_dir()):
        print("Kubernetes binaries missing (scripts/build-kube.sh): nothing to measure")
        return 0
    rendered = template(find_or_build_helm(), NEURON_CHART, "--set", "scheduler.enabled=true")
    rng = random.Random(args.seed)
    annotations = [usage_annotation(rng) for _ in range(args.nodes)]
    qps = [f"--kube-api-qps={args.client_qps}", f"--kube-api-burst={2 * args.client_qps}"]
    procs: list[subprocess.Popen[bytes]] = []
    with tempfile.TemporaryDirectory(prefix="fleet-ext-", dir="/tmp") as tmp_name, ControlPlane(
            Path(tmp_name) / "cp", extra_args={"kube-controller-manager": qps, "kube-scheduler": qps}) as cp:
        tmp = Path(tmp_name)
        clients = Clients(cp.admin_kubeconfig)
        extra = {NEURON: "16", NEURONCORE: str(16 * CORES_PER_DEVICE)}
        t_nodes = parallel(lambda i: create_node(clients, f"trn2-{i:05d}", INSTANCE, i, extra=extra,
                                                 annotations={USAGE_ANNOTATION: annotations[i]}), range(args.nodes))
        size = sum(len(a) for a in annotations) / len(annotations)
        print(f"{args.nodes} {INSTANCE} nodes created in {t_nodes:.1f} s (device-usage annotation {size:.0f} bytes "
              f"on average); {args.pods} pods asking for {NEURON}: 4", flush=True)
        tls = chart_tls(rendered, tmp / "tls")
        port, metrics_port = free_port(), free_port()
        env = {**os.environ, "KUBECONFIG": str(cp.admin_kubeconfig), **tls.extender_env}
        procs.append(subprocess.Popen(
            [console_script("neuron-scheduler-extender"), "serve", "--address", "127.0.0.1", "--port", str(port),
             "--metrics-address", "127.0.0.1", "--metrics-port", str(metrics_port), "--log-level", "WARNING"],
            env=env, stdout=(tmp / "extender.log").open("wb"), stderr=subprocess.STDOUT))
        config = scheduler_config(rendered, cp.state_dir / "scheduler.kubeconfig", port, tls)
        config["clientConnection"].update({"qps": args.client_qps, "burst": 2 * args.client_qps})
        (tmp / "my-scheduler.yaml").write_text(yaml.safe_dump(config))
        kubeconfig = cp.state_dir / "scheduler.kubeconfig"
        procs.append(subprocess.Popen(
            [str(cp.binary("kube-scheduler")), f"--config={tmp / 'my-scheduler.yaml'}", "--bind-address=127.0.0.1",
             f"--secure-port={free_port()}", f"--authentication-kubeconfig={kubeconfig}",
             f"--authorization-kubeconfig={kubeconfig}", f"--cert-dir={tmp / 'my-scheduler-certs'}"],
            stdout=(tmp / "my-scheduler.log").open("wb"), stderr=subprocess.STDOUT))
        try:
            wait_port(port)
            wait_port(metrics_port)
            time.sleep(3)  # informers of both schedulers and the extender's pod watch
            for i, (label, scheduler, pid) in enumerate((("default scheduler", None, cp.pids()["kube-scheduler"]),
                                                         ("my-scheduler + extender", "my-scheduler", procs[1].pid))):
                ns = f"run-{i}"
                fresh_namespace(clients.get(), ns)
                res = time_pods(clients, ns, [pod(f"p-{k:05d}", scheduler) for k in range(args.pods)], args.timeout,
                                pid)
                print(f"  {label:24s} {res['scheduled']:.0f}/{args.pods} scheduled, {res['pods_s']:5.1f} pods/s, "
                      f"create->scheduled p50 {res['p50']:5.0f} ms p99 {res['p99']:5.0f} ms, "
                      f"scheduler CPU {res['cpu_ms']:4.0f} ms/pod", flush=True)
                delete_pods(clients.get(), ns)
            text = urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=15).read().decode()
            for verb in ("filter", "prioritize"):
                p50, p99 = histogram_quantiles(text, "neuron_scheduler_extender_request_seconds", verb, (0.5, 0.99))
                print(f"  extender {verb:10s} p50 {p50:6.1f} ms, p99 {p99:6.1f} ms (from its histogram)")
            print(f"  RSS GiB: {rss_gib(cp)}, extender {rss_mib(procs[0].pid) / 1024:.2f}")
        finally:
            for p in procs:
                p.terminate()
            for p in procs:
                try:
                    p.wait(timeout=15)
                except subprocess.TimeoutExpired:
                    p.kill()
    print(f"load average: {', '.join(f'{x:.2f}' for x in os.getloadavg())} on {os.cpu_count()} CPUs")
    return 0


if __name__ == "__main__":
    sys.exit(main())
