"""What the fleet benchmarks share: per-thread API clients, a worker pool, kubelet-less Nodes labelled like real
ones, and timing a batch of pods from create to ``PodScheduled`` on a watch."""

from __future__ import annotations

import argparse
import statistics
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import psutil
from accel_rig.controlplane import ControlPlane
from lightkube import Client, KubeConfig
from lightkube.core.exceptions import ApiError
from lightkube.resources.core_v1 import Namespace, Node, NodeStatus, Pod, ServiceAccount
from lightkube.types import PatchType

WORKERS = 16
#: vCPU, memory and pods of the instance types the benchmarks use (the EC2 instance type pages)
NODE_RESOURCES = {"trn2.48xlarge": {"cpu": "192", "memory": "2048Gi", "pods": "110"},
                  "trn2u.48xlarge": {"cpu": "192", "memory": "2048Gi", "pods": "110"},
                  "p5.48xlarge": {"cpu": "192", "memory": "2048Gi", "pods": "110"}}


class Clients:
    """One lightkube Client per thread."""

    def __init__(self, kubeconfig: Path) -> None:
        self._config = KubeConfig.from_file(kubeconfig)
        self._local = threading.local()

    def get(self) -> Client:
        client: Client | None = getattr(self._local, "client", None)
        if client is None:
            client = self._local.client = Client(self._config, field_manager="bench-fleet")
        return client


def fleet_sizes(parser: argparse.ArgumentParser, text: str) -> list[int]:
    """``--nodes`` as ascending sizes; a parser error for anything but comma-separated integers."""
    try:
        return sorted(int(n) for n in text.split(","))
    except ValueError:
        parser.error(f"--nodes {text!r}: not a comma-separated list of integers")


def parallel(fn: Callable[[Any], object], items: Iterable[Any]) -> float:
    """Run ``fn`` over ``items`` on the worker pool; seconds taken."""
    t0 = time.perf_counter()
    with ThreadPoolExecutor(WORKERS) as pool:
        for _ in pool.map(fn, items):
            pass
    return time.perf_counter() - t0


def node_labels(name: str, instance_type: str, index: int) -> dict[str, str]:
    """The labels an EKS node of ``instance_type`` carries (spread over three zones)."""
    zone = "us-east-2" + "abc"[index % 3]
    return {"kubernetes.io/hostname": name, "kubernetes.io/os": "linux", "kubernetes.io/arch": "amd64",
            "node.kubernetes.io/instance-type": instance_type, "beta.kubernetes.io/instance-type": instance_type,
            "topology.kubernetes.io/region": "us-east-2", "topology.kubernetes.io/zone": zone,
            "eks.amazonaws.com/nodegroup": instance_type.replace(".", "-"),
            "eks.amazonaws.com/capacityType": "ON_DEMAND"}


def create_node(clients: Clients, name: str, instance_type: str, index: int, *,
                extra: Mapping[str, str] | None = None, annotations: Mapping[str, str] | None = None,
                labels: Mapping[str, str] | None = None) -> None:
    """A Ready, untainted Node with no kubelet (as ``ControlPlane.create_fake_node``, on a shared client);
    ``extra`` adds capacity/allocatable (extended resources), ``labels`` labels beyond an EKS node's own."""
    client = clients.get()
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    res = {**NODE_RESOURCES[instance_type], **(extra or {})}
    meta: dict[str, Any] = {"name": name, "labels": {**node_labels(name, instance_type, index), **(labels or {})}}
    if annotations:
        meta["annotations"] = dict(annotations)
    client.create(Node.from_dict({"metadata": meta}))  # type: ignore[call-overload]
    client.patch(NodeStatus, name, {"status": {"capacity": res, "allocatable": res, "conditions": [
        {"type": "Ready", "status": "True", "reason": "KubeletReady", "message": "fake node (no kubelet)",
         "lastHeartbeatTime": now, "lastTransitionTime": now}]}}, patch_type=PatchType.MERGE)
    client.patch(Node, name, {"spec": {"taints": None}}, patch_type=PatchType.MERGE)


def fresh_namespace(client: Client, name: str) -> None:
    client.create(Namespace.from_dict({"metadata": {"name": name}}))  # type: ignore[call-overload]
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:  # the controller-manager makes the service account admission looks up
        try:
            client.get(ServiceAccount, "default", namespace=name)
            return
        except ApiError:
            time.sleep(0.2)
    raise TimeoutError(f"namespace {name}: no default service account after 60 s")


def cpu_seconds(pid: int) -> float:
    times = psutil.Process(pid).cpu_times()
    return float(times.user + times.system)


def percentile(sorted_values: list[float], q: float) -> float:
    return sorted_values[min(len(sorted_values) - 1, round(q * (len(sorted_values) - 1)))]


def time_pods(clients: Clients, ns: str, pods: list[dict[str, Any]], timeout: float,
              scheduler_pid: int, batch: int = 0) -> dict[str, float]:
    """Create ``pods`` at once in ``ns`` (or ``batch`` at a time, each batch once the one before is scheduled);
    pods/s (all scheduled / first create -> last PodScheduled), create -> PodScheduled p50/p99 (ms) and the
    scheduler's CPU ms per pod (its CPU time is what the work costs it; wall time also carries whatever else the 2
    shared cores are doing)."""
    scheduled: dict[str, float] = {}
    created: dict[str, float] = {}
    done = threading.Event()

    def watch() -> None:
        for _, pod in clients.get().watch(Pod, namespace=ns):
            conds = (pod.status.conditions if pod.status else None) or []
            name = pod.metadata.name if pod.metadata else None
            if name and name not in scheduled and any(c.type == "PodScheduled" and c.status == "True" for c in conds):
                scheduled[name] = time.perf_counter()
                if len(scheduled) >= len(pods):
                    done.set()
            if done.is_set():
                return

    threading.Thread(target=watch, daemon=True).start()
    time.sleep(0.5)  # the watch is open before the first create

    def create(pod: dict[str, Any]) -> None:
        created[pod["metadata"]["name"]] = time.perf_counter()
        clients.get().create(Pod.from_dict(pod), namespace=ns)  # type: ignore[call-overload]

    cpu0 = cpu_seconds(scheduler_pid)
    if batch:
        deadline = time.monotonic() + timeout
        for first in range(0, len(pods), batch):
            chunk = pods[first:first + batch]
            parallel(create, chunk)
            while any(p["metadata"]["name"] not in scheduled for p in chunk) and time.monotonic() < deadline:
                time.sleep(0.005)
    else:
        parallel(create, pods)
    done.wait(timeout)
    done.set()
    cpu_ms = (cpu_seconds(scheduler_pid) - cpu0) * 1e3 / max(len(scheduled), 1)
    if len(scheduled) < len(pods):
        print(f"  {len(pods) - len(scheduled)} pods not scheduled after {timeout:.0f} s; e.g. "
              f"{unscheduled_reason(clients.get(), ns, scheduled)}", flush=True)
    if not scheduled:
        return {"scheduled": 0, "pods_s": 0.0, "p50": float("nan"), "p99": float("nan"), "cpu_ms": float("nan")}
    lat = sorted((scheduled[n] - created[n]) * 1e3 for n in scheduled)
    span = max(scheduled.values()) - min(created.values())
    return {"scheduled": len(scheduled), "pods_s": len(scheduled) / span, "p50": statistics.median(lat),
            "p99": percentile(lat, 0.99), "cpu_ms": cpu_ms}


def unscheduled_reason(client: Client, ns: str, scheduled: Mapping[str, float]) -> str:
    """The scheduler's message on the first pod of ``ns`` not in ``scheduled``."""
    for pod in client.list(Pod, namespace=ns):
        name = pod.metadata.name if pod.metadata else None
        if name and name not in scheduled:
            conds = (pod.status.conditions if pod.status else None) or []
            why = next((f"{c.reason}: {c.message}" for c in conds if c.type == "PodScheduled"), "no condition yet")
            return f"{name}: {why}"
    return "(none found)"


def delete_pods(client: Client, ns: str) -> None:
    """Force-delete every pod in ``ns`` (no kubelet would ever confirm a graceful delete)."""
    for pod in client.list(Pod, namespace=ns):
        if pod.metadata and pod.metadata.name:
            client.delete(Pod, pod.metadata.name, namespace=ns, grace_period=0)


def rss_gib(cp: ControlPlane) -> str:
    return ", ".join(f"{name} {psutil.Process(pid).memory_info().rss / 2**30:.2f}" for name, pid in cp.pids().items())
