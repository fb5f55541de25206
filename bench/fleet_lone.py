"""A lone claim's latency for :mod:`bench_fleet_sim`: pods created one at a time (each waits for the one before it to
be scheduled), into the cluster as it is and into a half-full one.

Half-full is made without the scheduler (placing half of a 5,000-node fleet through it would take 10,000 pods, a
quarter of an hour here): one ResourceClaim per node, allocated by writing its status as the scheduler would
(results naming the first half of the node's devices, a node selector on the node), so the scheduler's allocator
counts those devices as in use, as it does for any allocated claim.
"""

from __future__ import annotations

import statistics
import threading
import time
from typing import Any

from fleet_common import Clients, fresh_namespace, parallel, percentile
from lightkube.resources.core_v1 import Pod
from lightkube.resources.resource_v1 import ResourceClaim, ResourceClaimStatus
from lightkube.types import PatchType

FILL_REQUEST = "half"


def lone_pods(clients: Clients, ns: str, pods: list[dict[str, Any]], timeout: float) -> dict[str, float]:
    """Create ``pods`` one at a time, each after the one before it has ``PodScheduled``; create -> scheduled
    p50/p99/max in ms (one watch on the namespace, which exists, sees every pod)."""
    scheduled: dict[str, float] = {}
    seen = threading.Condition()

    def watch() -> None:
        for _, pod in clients.get().watch(Pod, namespace=ns):
            conds = (pod.status.conditions if pod.status else None) or []
            name = pod.metadata.name if pod.metadata else None
            if name and name not in scheduled and any(c.type == "PodScheduled" and c.status == "True" for c in conds):
                with seen:
                    scheduled[name] = time.perf_counter()
                    seen.notify_all()
            if len(scheduled) >= len(pods):
                return

    threading.Thread(target=watch, daemon=True).start()
    time.sleep(0.5)  # the watch is open before the first create
    lat: list[float] = []
    for pod in pods:
        name = pod["metadata"]["name"]
        t0 = time.perf_counter()
        clients.get().create(Pod.from_dict(pod), namespace=ns)  # type: ignore[call-overload]
        with seen:
            if not seen.wait_for(lambda: name in scheduled, timeout):  # noqa: B023 (called before the next pod)
                break
        lat.append((scheduled[name] - t0) * 1e3)
    if not lat:
        return {"scheduled": 0, "p50": float("nan"), "p99": float("nan"), "max": float("nan")}
    lat.sort()
    return {"scheduled": len(lat), "p50": statistics.median(lat), "p99": percentile(lat, 0.99), "max": lat[-1]}


def fill_half(clients: Clients, ns: str, nodes: list[str], driver: str, devices: list[str],
              device_class: str) -> float:
    """Allocate the first half of ``devices`` (every node's pool has the same device names, in order) on every
    node to one claim per node; seconds taken."""
    fresh_namespace(clients.get(), ns)

    def one(node: str) -> None:
        half = devices[: len(devices) // 2]
        client = clients.get()
        client.create(ResourceClaim.from_dict({  # type: ignore[call-overload]
            "metadata": {"name": f"fill-{node}"},
            "spec": {"devices": {"requests": [{"name": FILL_REQUEST, "exactly": {
                "deviceClassName": device_class, "count": len(half)}}]}}}), namespace=ns)
        client.patch(ResourceClaimStatus, f"fill-{node}", {"status": {"allocation": {
            "devices": {"results": [{"request": FILL_REQUEST, "driver": driver, "pool": node, "device": d}
                                    for d in half]},
            "nodeSelector": {"nodeSelectorTerms": [{"matchFields": [
                {"key": "metadata.name", "operator": "In", "values": [node]}]}]}}}},
            namespace=ns, patch_type=PatchType.MERGE)

    return parallel(one, nodes)


def delete_claims(clients: Clients, ns: str) -> None:
    """Delete every claim of ``ns`` one by one (a DELETE COLLECTION of thousands times out)."""
    client = clients.get()
    names = [c.metadata.name for c in client.list(ResourceClaim, namespace=ns) if c.metadata and c.metadata.name]
    parallel(lambda n: clients.get().delete(ResourceClaim, n, namespace=ns), names)
