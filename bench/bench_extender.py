"""neuron-scheduler-extender figures.

1. filter and prioritize latency, p50/p99, for 100 and 1,000 synthetic nodes (trn2.48xlarge and trn1.32xlarge with
   random usage published as device-usage annotations, full Node objects as kube-scheduler sends them with
   nodeCacheCapable: false). Timed per call: JSON decode of the ExtenderArgs body, the decisions, JSON encode of
   the answer (what the extender's worker thread does per request).
2. Share of pods given a connected set over a long random arrival/departure sequence on a small cluster, with and
   without the extender. Without: a node is picked among those whose counts fit (as the default scheduler sees
   extended resources) and the device plugin's policy picks the IDs. With: only nodes where the extender's filter
   passes, best prioritize score first. An arrival that fits no node is dropped (counted separately).
3. With ``--api-server``: time from an Allocate in the device plugin to the device-usage annotation accepted by a
   real kube-apiserver (the plugin's UsagePublisher and OwnNode against a fake trn2.48xlarge host), p50/p99.

    PYTHONPATH=. .venv/bin/python bench/bench_extender.py [--calls 200] [--arrivals 5000] [--nodes 16] [--api-server]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from lightkube import AsyncClient, KubeConfig

from neuron_dra.allocation import choose_cores, choose_devices
from neuron_dra.extender.decide import Decider
from neuron_dra.extender.placement import NodeState, Request, place, score
from neuron_dra.topology import Topology
from neuron_dra.usage_annotation import USAGE_ANNOTATION, DeviceUsage

NEURON = "aws.amazon.com/neuron"
NEURONCORE = "aws.amazon.com/neuroncore"
SHAPES = {"trn2.48xlarge": 4, "trn1.32xlarge": 2}  # logical cores per device (trn2 at LNC 2)
#: (resource, count) arrivals: whole devices 1/2/4/8, cores 1/2/4/8
MIX = [(NEURON, 1), (NEURON, 2), (NEURON, 4), (NEURON, 4), (NEURON, 8),
       (NEURONCORE, 1), (NEURONCORE, 2), (NEURONCORE, 4), (NEURONCORE, 8)]


def _random_state(rng: random.Random, per: int) -> NodeState:
    state = NodeState(Topology.regular("torus4x4", 16), per)
    for _ in range(rng.randrange(0, 8)):
        resource, count = rng.choice(MIX)
        res = place(state, [Request("c", resource, count)])
        if res.ok:
            state = res.state
    return state


def _node(name: str, itype: str, state: NodeState) -> dict[str, Any]:
    usage = DeviceUsage("torus4x4", 16, state.cores_per_device, state.used_devices, state.used_cores,
                        instance_type=itype, generation=1)
    return {
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": name, "uid": f"uid-{name}", "resourceVersion": "1",
                     "labels": {"kubernetes.io/hostname": name, "node.kubernetes.io/instance-type": itype,
                                "topology.kubernetes.io/zone": "us-east-2a", "kubernetes.io/os": "linux"},
                     "annotations": {USAGE_ANNOTATION: usage.to_json(),
                                     "node.alpha.kubernetes.io/ttl": "0"}},
        "spec": {"providerID": f"aws:///us-east-2a/i-{name}"},
        "status": {"capacity": {"cpu": "192", "memory": "2097152Mi", "pods": "110", NEURON: "16",
                                NEURONCORE: str(16 * state.cores_per_device)},
                   "allocatable": {"cpu": "191", "memory": "2000000Mi", "pods": "110", NEURON: "16",
                                   NEURONCORE: str(16 * state.cores_per_device)},
                   "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady"}],
                   "addresses": [{"type": "InternalIP", "address": "10.0.0.1"}]},
    }


def _pod(resource: str, count: int) -> dict[str, Any]:
    return {"metadata": {"name": "bench", "namespace": "default", "uid": "bench-uid"},
            "spec": {"schedulerName": "my-scheduler",
                     "containers": [{"name": "c", "resources": {"limits": {resource: str(count)}}}]}}


def latency(nodes: int, calls: int, seed: int, warm: bool) -> dict[str, tuple[float, float, float]]:
    """verb -> (p50 ms, p99 ms, body MB). ``warm``: one extender for all calls (its parse and placement caches
    filled by earlier calls); else a fresh one per call (every annotation parsed, every placement computed)."""
    rng = random.Random(seed)
    items = []
    for i in range(nodes):
        itype = rng.choice(list(SHAPES))
        items.append(_node(f"node-{i}", itype, _random_state(rng, SHAPES[itype])))
    decider = Decider()
    out = {}
    for verb in ("filter", "prioritize"):
        samples = []
        size = 0
        for k in range(calls):
            if not warm:
                decider = Decider()
            resource, count = MIX[k % len(MIX)]
            body = json.dumps({"Pod": _pod(resource, count), "Nodes": {"items": items}}).encode()
            size = len(body)
            start = time.perf_counter()
            args = json.loads(body)
            if verb == "filter":
                _, answer, _ = decider.filter(args, [])
                json.dumps(answer).encode()
            else:
                scores, _ = decider.prioritize(args, [])
                json.dumps(scores).encode()
            samples.append((time.perf_counter() - start) * 1000)
        samples.sort()
        out[verb] = (statistics.median(samples), samples[min(len(samples) - 1, int(len(samples) * 0.99))],
                     size / 1e6)
    return out


def _count_fit(state: NodeState, resource: str, count: int) -> bool:
    """What the default scheduler sees: the free count of the resource (the plugin withdraws the other's IDs)."""
    return len(state.free_devices() if resource == NEURON else state.free_cores()) >= count


def _plugin_allocates(state: NodeState, resource: str, count: int) -> tuple[tuple[int, ...], bool]:
    """The device plugin's answer for the kubelet (its GetPreferredAllocation policy) and whether it is connected."""
    if resource == NEURON:
        choice = choose_devices(state.topology, state.free_devices(), (), count)
    else:
        choice = choose_cores(state.topology, state.cores_per_device, state.free_cores(), (), count)
    return choice.ids, choice.connected


def simulate(with_extender: bool, nodes: int, arrivals: int, seed: int, departure: float
             ) -> tuple[int, int, int]:
    """(pods placed, of those given a connected set, arrivals that fit no node and waited)."""
    rng = random.Random(seed)
    pick = random.Random(seed + 1)
    states = [NodeState(Topology.regular("torus4x4", 16), SHAPES[t])
              for t in (list(SHAPES) * nodes)[:nodes]]
    running: list[tuple[int, str, tuple[int, ...]]] = []
    placed = connected = waited = 0
    for _ in range(arrivals):
        while running and rng.random() < departure:
            node, resource, ids = running.pop(rng.randrange(len(running)))
            st = states[node]
            if resource == NEURON:
                states[node] = NodeState(st.topology, st.cores_per_device, st.used_devices - set(ids),
                                         st.used_cores, st.unhealthy)
            else:
                states[node] = NodeState(st.topology, st.cores_per_device, st.used_devices,
                                         st.used_cores - set(ids), st.unhealthy)
        resource, count = rng.choice(MIX)
        if with_extender:
            scored = []
            for i, st in enumerate(states):
                res = place(st, [Request("c", resource, count)])
                if res.ok:
                    scored.append((score(st, res.state), pick.random(), i))
            if not scored:
                waited += 1
                continue
            node = max(scored)[2]
        else:
            fits = [i for i, st in enumerate(states) if _count_fit(st, resource, count)]
            if not fits:
                waited += 1
                continue
            node = pick.choice(fits)
        ids, ok = _plugin_allocates(states[node], resource, count)
        states[node] = states[node].take(resource, ids)
        running.append((node, resource, ids))
        placed += 1
        connected += ok
    return placed, connected, waited


def annotation_latency(changes: int) -> tuple[float, float]:
    """(p50 ms, p99 ms) from an Allocate to the API server accepting the new device-usage annotation."""
    from accel_rig.controlplane import ControlPlane

    from accel_core.fakehost import build_host
    from accel_core.ownnode import OwnNode
    from accel_core.paths import HostPaths
    from neuron_dra.deviceplugin import NeuronDevicePolicy, NeuronNode
    from neuron_dra.deviceplugin.publish import UsagePublisher

    with tempfile.TemporaryDirectory(prefix="bench-ext-") as tmp:
        root = Path(tmp)
        fake = build_host(root / "host", "trn2.48xlarge")
        node = NeuronNode(HostPaths(host_root=fake.root, kubelet_root=root / "k",
                                    device_plugins=root / "k" / "device-plugins"))
        node.rediscover()
        with ControlPlane(root / "cp", with_scheduler=False, with_controller_manager=False) as cp:
            cp.create_fake_node("bench-node")

            async def run() -> list[float]:
                client = AsyncClient(KubeConfig.from_file(cp.admin_kubeconfig), field_manager="bench")
                own = OwnNode(client, "bench-node")
                publisher = UsagePublisher(node, own)
                node.on_change = publisher.publish
                stop = asyncio.Event()
                task = asyncio.create_task(own.run(stop))
                policy = NeuronDevicePolicy(node)
                samples = []
                for i in range(changes):
                    await asyncio.sleep(0.05)
                    start = time.perf_counter()
                    policy.allocate([str(i % 16)])
                    await own.in_sync.wait()
                    samples.append((time.perf_counter() - start) * 1000)
                    node.usage.apply_list({})  # the pod is gone again
                    node.notify()
                    await own.in_sync.wait()
                stop.set()
                await task
                await client.close()
                return samples

            samples = sorted(asyncio.run(run()))
    return statistics.median(samples), samples[min(len(samples) - 1, int(len(samples) * 0.99))]


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=200, help="calls per verb at 100 nodes (a fifth at 1,000)")
    parser.add_argument("--arrivals", type=int, default=5000)
    parser.add_argument("--nodes", type=int, default=16, help="nodes in the arrival/departure simulation")
    parser.add_argument("--seed", type=int, default=13)
    parser.add_argument("--departure", type=float, default=0.4,
                        help="chance of one more departure before each arrival (lower = fuller cluster)")
    parser.add_argument("--api-server", action="store_true",
                        help="also measure Allocate -> annotation on a real kube-apiserver (starts one)")
    args = parser.parse_args()
    print("filter / prioritize latency (JSON decode + decisions + JSON encode, one pod, full Node objects)")
    for nodes, calls in ((100, args.calls), (1000, max(10, args.calls // 5))):
        for warm in (False, True):
            for verb, (p50, p99, mb) in latency(nodes, calls, args.seed, warm).items():
                print(f"  {nodes:5d} nodes  {verb:10s} {'warm' if warm else 'cold'}  p50 {p50:8.2f} ms  "
                      f"p99 {p99:8.2f} ms  (body {mb:.1f} MB, {calls} calls)")
    print(f"connected sets over {args.arrivals} random arrivals with departures, {args.nodes} nodes "
          f"(trn2.48xlarge + trn1.32xlarge)")
    for label, flag in (("without extender", False), ("with extender", True)):
        placed, good, waited = simulate(flag, args.nodes, args.arrivals, args.seed, args.departure)
        print(f"  {label:17s} placed {placed:5d}  connected {good:5d} ({100 * good / max(placed, 1):5.1f}%)  "
              f"waited (fit no node) {waited}")
    if args.api_server:
        p50, p99 = annotation_latency(100)
        print(f"Allocate -> device-usage annotation accepted by kube-apiserver: p50 {p50:.0f} ms  p99 {p99:.0f} ms "
              "(100 changes; includes OwnNode's 0.2 s coalescing)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
