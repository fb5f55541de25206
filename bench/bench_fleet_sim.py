"""Fleet scale without kubelets: one real kube-apiserver, etcd, kube-scheduler and kube-controller-manager, N Nodes
labelled as real nodes of their instance type, and for each Node the ResourceSlices our drivers would publish for it
(built by the drivers' own scan and slice code, see :mod:`fleet_shapes`), created directly through the API.

Workload: ``--pods`` pods using one of the seed's claim templates (examples/), created at once. For each slice
shape (``--shapes``: ``ours``, ``minimal`` = the same devices with only the attributes the workloads read, and
the ``no-*`` variants that drop one part of ours) it prints pods/s (all pods / first create -> last PodScheduled),
the p50/p99 from each pod's create to its PodScheduled (seen on a watch) and the scheduler's CPU time per pod.
``--prefill`` first places that many pods of the same workload, untimed (a half-full cluster). ``--lone`` then
times pods one at a time, into the empty cluster and (``--half-full``) into one with half of every node's devices
allocated (see :mod:`fleet_lone`). ``--nodes 100,500,5000`` grows one fleet in place. Between shapes the
slices are replaced and the previous pods and claims deleted. The controller-manager and scheduler get a higher
client QPS (``--client-qps``): at their defaults (20 and 50) the claim controller caps a DRA workload near
10 pods/s, whatever the slices look like.

    .venv/bin/python bench/bench_fleet_sim.py --nodes 500,5000 --mix trn2 --pods 100 --shapes ours,minimal \
        --repeat 2 --lone 40 --half-full

Mixes: ``trn2`` (trn2.48xlarge, Neuron slices), ``trn2-efa`` (plus its EFA slices), ``p5`` (p5.48xlarge, EFA),
``trn2u`` (trn2u.48xlarge in 4-node UltraServers: chips consuming the node's counters, a ``neuron_node`` device, the
UltraServer node labels; its workload is the seed's 4-node UltraServer StatefulSet, its pods created in groups of 4
that each carry their own ``app`` label, so each group's affinity keeps it inside one UltraServer; a group is
created once the one before is scheduled: groups created at once can start in one UltraServer and wait for each
other forever, as several such StatefulSets applied at once would without gang scheduling).

``--core-devices off,on`` runs every shape twice, interleaved: Neuron slices as the driver publishes them without
and with NeuronCores as devices (``CORE_DEVICES``; chips consuming per-core counters, a device per logical core;
``node-label``: as a Node publishes them that did not opt in, the chips consuming the counters without cores),
with the chart's DeviceClasses of either setting (``neuron.aws.com`` leaves the cores out, ``neuroncore.aws.com``
selects them), and prints each shape's "on" against its "off". ``--workload bench/workloads/2-neuroncores.yaml``
is a core workload (needs ``on``).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from accel_rig.controlplane import ControlPlane
from accel_rig.kubeversions import kube_bin_dir, missing_binaries
from fleet_common import Clients, create_node, delete_pods, fleet_sizes, fresh_namespace, parallel, rss_gib, time_pods
from fleet_lone import delete_claims, fill_half, lone_pods
from fleet_shapes import SHAPES, Fleet, needed_attributes, replace_strings, reshape
from lightkube import ApiError
from lightkube.resources.resource_v1 import DeviceClass, ResourceClaim, ResourceClaimTemplate, ResourceSlice

from neuron_dra.dra.cores import (
    CHIP_CLASS_SELECTOR,
    CORE_CLASS,
    CORE_CLASS_SELECTOR,
    MODES,
    PLAIN_CLASS_SELECTOR,
    parse_core_device,
)

REPO = Path(__file__).resolve().parent.parent
MIXES: dict[str, tuple[str, bool, str]] = {  # instance type, EFA slices, default workload
    "trn2": ("trn2.48xlarge", False, "examples/neuron-dra/1x4-connected-neurons.yaml"),
    "trn2-efa": ("trn2.48xlarge", True, "examples/efa-dra/trn2-4-neurons-with-their-efa.yaml"),
    "p5": ("p5.48xlarge", True, "examples/efa-dra/p5-4-efa-one-pcie-root.yaml"),
    "trn2u": ("trn2u.48xlarge", False, "examples/neuron-dra/ultraserver/4-node-ultraserver.yaml"),
}
DEVICE_CLASSES = {"neuron.aws.com": "neuron.aws.com", "efa.networking.k8s.aws": "efa.aws.com"}


def set_device_classes(clients: Clients, core_devices: str) -> None:
    """The charts' DeviceClasses for ``draDriver.coreDevices.enabled`` off or on (neuron_dra.dra.cores' selectors,
    which tests/unit/neuron/test_neuron_core_devices.py checks against the chart)."""
    selectors = {name: f'device.driver == "{driver}"' for name, driver in DEVICE_CLASSES.items()}
    selectors["neuron.aws.com"] = CHIP_CLASS_SELECTOR if core_devices != "off" else PLAIN_CLASS_SELECTOR
    if core_devices != "off":
        selectors[CORE_CLASS] = CORE_CLASS_SELECTOR
    client = clients.get()
    for name in [*DEVICE_CLASSES, CORE_CLASS]:
        with contextlib.suppress(ApiError):
            client.delete(DeviceClass, name)
    for name, expression in selectors.items():
        client.create(DeviceClass.from_dict({"metadata": {"name": name}, "spec": {"selectors": [  # type: ignore[call-overload]
            {"cel": {"expression": expression}}]}}))


def publish(clients: Clients, nodes: list[str], fleet: Fleet, shape: str, needed: frozenset[str]) -> float:
    """Delete all slices, then create ``shape`` of our slices for every node; seconds for the creates."""
    names = [s.metadata.name for s in clients.get().list(ResourceSlice) if s.metadata and s.metadata.name]
    parallel(lambda name: clients.get().delete(ResourceSlice, name), names)  # one DELETE COLLECTION times out at 5,000

    def one(node: str) -> None:
        for obj in reshape(fleet.slices(node, int(node[-5:])), shape, needed):
            clients.get().create(ResourceSlice.from_dict(obj))  # type: ignore[call-overload]
    return parallel(one, nodes)


@dataclass(frozen=True)
class Workload:
    """A seed example: its ResourceClaimTemplate and the pod (or StatefulSet pod template) that uses it."""

    template: dict[str, Any]
    needed: frozenset[str]
    """The attributes its selectors and constraints read (what the minimal shape keeps)."""
    claim: str
    pod: dict[str, Any] | None
    """A StatefulSet's pod template, or None for a single Pod (built by :func:`pod_manifest`)."""
    group: int = 1
    """Pods per group (the StatefulSet's replicas): each group gets its own ``app`` label."""

    @classmethod
    def load(cls, path: Path) -> Workload:
        docs = [d for d in yaml.safe_load_all(path.read_text()) if d]
        template = next(d for d in docs if d["kind"] == "ResourceClaimTemplate")
        needed = needed_attributes(yaml.safe_dump(template))
        for doc in docs:
            if doc["kind"] == "Pod":
                return cls(template, needed, doc["spec"]["resourceClaims"][0]["name"], None)
            if doc["kind"] == "StatefulSet":
                pod = doc["spec"]["template"]
                return cls(template, needed, pod["spec"]["resourceClaims"][0]["name"], pod,
                           int(doc["spec"]["replicas"]))
        raise ValueError(f"{path}: no Pod or StatefulSet uses its ResourceClaimTemplate")

    @property
    def name(self) -> str:
        return str(self.template["metadata"]["name"])

    def pods(self, prefix: str, count: int) -> list[dict[str, Any]]:
        if self.pod is None:
            return [pod_manifest(f"{prefix}-{i:05d}", self.name, self.claim) for i in range(count)]
        if count % self.group:
            raise ValueError(f"{count} pods: not whole groups of {self.group}")
        app = self.pod["metadata"]["labels"]["app"]
        out = []
        for i in range(count):  # the app label's value (the pod's and its affinity selectors') is the group's own
            pod = replace_strings(self.pod, {app: f"{app}-g{i // self.group}"})
            pod["metadata"]["name"] = f"{prefix}-{i:05d}"
            pod["spec"]["terminationGracePeriodSeconds"] = 0
            out.append(pod)
        return out


def pod_manifest(name: str, template: str, claim: str) -> dict[str, Any]:
    return {"metadata": {"name": name},
            "spec": {"containers": [{"name": "app", "image": "busybox", "resources": {"claims": [{"name": claim}]}}],
                     "resourceClaims": [{"name": claim, "resourceClaimTemplateName": template}],
                     "terminationGracePeriodSeconds": 0}}


def run_workload(clients: Clients, ns: str, workload: Workload, pods: int, timeout: float,
                 scheduler_pid: int) -> dict[str, float]:
    """The seed template's pods, ``pods`` of them created at once (see :func:`fleet_common.time_pods`)."""
    client = clients.get()
    fresh_namespace(client, ns)
    client.create(ResourceClaimTemplate.from_dict(workload.template), namespace=ns)  # type: ignore[call-overload]
    return time_pods(clients, ns, workload.pods("p", pods), timeout, scheduler_pid,
                     batch=workload.group if workload.group > 1 else 0)


def clean_namespace(clients: Clients, ns: str) -> int:
    """Force-delete the pods, then wait for their claims to go (so the devices are free again); claims left."""
    client = clients.get()
    delete_pods(client, ns)
    deadline = time.monotonic() + 120
    left = len(list(client.list(ResourceClaim, namespace=ns)))
    while left and time.monotonic() < deadline:
        time.sleep(0.5)
        left = len(list(client.list(ResourceClaim, namespace=ns)))
    return left


def summarise(size: int, results: list[tuple[str, dict[str, float]]]) -> None:
    """Per shape, the medians over its runs and their ratio to the minimal shape's (and a ``<shape> cores-on``
    run's to its ``<shape> cores-off``)."""
    by_shape: dict[str, dict[str, float]] = {}
    for shape in dict(results):
        runs = [r for s, r in results if s == shape]
        by_shape[shape] = {k: statistics.median(r[k] for r in runs) for k in ("pods_s", "p50", "p99", "cpu_ms")}
    base = by_shape.get("minimal")
    for shape, med in by_shape.items():
        line = (f"  {size} nodes: median {shape:18s} {med['pods_s']:5.1f} pods/s, p50 {med['p50']:5.0f} ms, "
                f"p99 {med['p99']:5.0f} ms, scheduler CPU {med['cpu_ms']:4.0f} ms/pod")
        if base and med["pods_s"] and med["cpu_ms"]:
            line += (f"; vs minimal: time per pod x{base['pods_s'] / med['pods_s']:.2f}, "
                     f"scheduler CPU per pod x{med['cpu_ms'] / base['cpu_ms']:.2f}")
        off = (by_shape.get(shape.rsplit(" cores-", 1)[0] + " cores-off")
               if " cores-" in shape and not shape.endswith(" cores-off") else None)
        if off and med["pods_s"] and off["cpu_ms"]:
            line += (f"; vs cores-off: time per pod x{off['pods_s'] / med['pods_s']:.2f}, "
                     f"scheduler CPU per pod x{med['cpu_ms'] / off['cpu_ms']:.2f}")
        print(line, flush=True)


def lone_runs(clients: Clients, tag: str, shape: str, args: argparse.Namespace, nodes: list[str],
              fleet: Fleet, workload: Workload) -> None:
    """``--lone`` pods one at a time into the empty cluster, then (``--half-full``) into a half-full one."""
    client = clients.get()
    kinds = fleet.kinds(0)
    phases = ["empty"] + (["half-full"] if args.half_full else [])
    filled: set[str] = set()
    for phase in phases:
        ns = f"lone-{tag}-{phase}"
        if phase == "half-full":
            devices = [d.name for d in kinds[0].devices
                       if d.name.startswith("neuron-device-") and parse_core_device(d.name) is None]
            filled = set(devices[: len(devices) // 2])
            t_fill = fill_half(clients, f"fill-{tag}", nodes, kinds[0].driver, devices,
                               next(k for k, v in DEVICE_CLASSES.items() if v == kinds[0].driver))
            time.sleep(3)  # let the scheduler's informers catch up
            print(f"  {shape:20s} half-full: {len(nodes)} claims of {len(devices) // 2} devices allocated in "
                  f"{t_fill:.1f} s", flush=True)
        fresh_namespace(client, ns)
        client.create(ResourceClaimTemplate.from_dict(workload.template), namespace=ns)  # type: ignore[call-overload]
        res = lone_pods(clients, ns, workload.pods("l", args.lone), args.timeout)
        taken = sum(r.device in filled for c in client.list(ResourceClaim, namespace=ns)
                    for r in ((c.status.allocation.devices.results or []) if c.status and c.status.allocation
                              and c.status.allocation.devices else []))
        print(f"  {shape:20s} lone claim, {phase:9s}: {res['scheduled']:.0f}/{args.lone} pods one at a time, "
              f"create->scheduled p50 {res['p50']:5.0f} ms p99 {res['p99']:5.0f} ms max {res['max']:5.0f} ms; "
              f"devices given that the fill holds: {taken}", flush=True)
        clean_namespace(clients, ns)
    if args.half_full:
        delete_claims(clients, f"fill-{tag}")
        clean_namespace(clients, f"fill-{tag}")


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--nodes", default="100", help="fleet sizes, comma-separated, grown in place (100,500,5000)")
    parser.add_argument("--mix", choices=sorted(MIXES), default="trn2")
    parser.add_argument("--pods", type=int, default=200)
    parser.add_argument("--shapes", default="ours,minimal", help=f"comma-separated, of {', '.join(SHAPES)}")
    parser.add_argument("--workload", default=None, help="claim template example (default: the mix's)")
    parser.add_argument("--client-qps", type=int, default=500, help="scheduler/controller-manager API QPS")
    parser.add_argument("--prefill", type=int, default=0,
                        help="pods of the same workload placed first (untimed), e.g. half the fleet's capacity")
    parser.add_argument("--repeat", type=int, default=1, help="run the list of shapes this many times, in turn")
    parser.add_argument("--lone", type=int, default=0,
                        help="then this many pods one at a time (first round, --lone-shapes only)")
    parser.add_argument("--lone-shapes", default="ours,minimal", help="shapes the --lone pods run against")
    parser.add_argument("--half-full", action="store_true",
                        help="repeat the --lone pods with half of every node's devices allocated")
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds to wait for one workload")
    parser.add_argument("--core-devices", default="off",
                        help="off, on, node-label or a list (off,on): Neuron slices without/with NeuronCores as "
                             "devices (node-label: as a Node that did not opt in publishes them; each shape runs "
                             "once per setting, interleaved)")
    args = parser.parse_args()
    modes = args.core_devices.split(",")
    if not modes or any(m not in MODES for m in modes):
        parser.error(f"--core-devices: some of {', '.join(MODES)}, not {args.core_devices!r}")
    shapes = args.shapes.split(",")
    unknown = [s for s in shapes + args.lone_shapes.split(",") if s not in SHAPES]
    if unknown:
        parser.error(f"unknown shapes {unknown}; known: {', '.join(SHAPES)}")
    sizes = fleet_sizes(parser, args.nodes)
    if missing_binaries(kube_bin_dir()):
        print("Kubernetes binaries missing (scripts/build-kube.sh): nothing to measure")
        return 0
    instance_type, efa, default_workload = MIXES[args.mix]
    workload_path = REPO / (args.workload or default_workload)
    workload = Workload.load(workload_path)
    if args.pods % workload.group or args.prefill % workload.group:
        parser.error(f"{workload_path.name} places pods in groups of {workload.group}: --pods and --prefill must be "
                     "multiples of it")
    if args.lone and workload.group > 1:
        parser.error("--lone times single pods; the UltraServer workload places groups")
    fleets = {mode: Fleet.of(instance_type, efa=efa, core_devices=mode) for mode in modes}
    labelled = fleets[modes[0]]  # the Node labels are the same either way
    qps = [f"--kube-api-qps={args.client_qps}", f"--kube-api-burst={2 * args.client_qps}"]
    with tempfile.TemporaryDirectory(prefix="fleet-sim-", dir="/tmp") as tmp, ControlPlane(
            Path(tmp) / "cp", extra_args={"kube-controller-manager": qps, "kube-scheduler": qps}) as cp:
        clients = Clients(cp.admin_kubeconfig)
        nodes: list[str] = []
        for size in sizes:
            new = [f"{args.mix}-{i:05d}" for i in range(len(nodes), size)]
            t_nodes = parallel(lambda name: create_node(clients, name, instance_type, int(name[-5:]),
                                                        labels=labelled.labels(int(name[-5:]))), new)
            nodes += new
            print(f"{size} {instance_type} nodes ({len(new)} created in {t_nodes:.1f} s); workload "
                  f"{workload_path.name}, {args.pods} pods; slices per node: {', '.join(labelled.drivers)}; the "
                  f"minimal shape keeps {', '.join(sorted(workload.needed))}", flush=True)
            results: list[tuple[str, dict[str, float]]] = []
            for i, (shape, mode) in enumerate([(s, m) for s in shapes for m in modes] * args.repeat):
                tag = f"{size}-{i}"
                fleet = fleets[mode]
                set_device_classes(clients, mode)
                t_pub = publish(clients, nodes, fleet, shape, workload.needed)
                label = shape if len(modes) == 1 else f"{shape} cores-{mode}"
                time.sleep(3)  # let the scheduler's informers catch up
                if args.prefill:
                    fill = run_workload(clients, f"fill-{tag}", workload, args.prefill, args.timeout * 10,
                                        cp.pids()["kube-scheduler"])
                    print(f"  {shape:20s} prefilled: {fill['scheduled']:.0f}/{args.prefill} pods placed", flush=True)
                res = run_workload(clients, f"run-{tag}", workload, args.pods, args.timeout,
                                   cp.pids()["kube-scheduler"])
                results.append((label, res))
                print(f"  {label:20s} slices published {t_pub:5.1f} s; {res['scheduled']:.0f}/{args.pods} scheduled, "
                      f"{res['pods_s']:5.1f} pods/s, create->scheduled p50 {res['p50']:5.0f} ms "
                      f"p99 {res['p99']:5.0f} ms, scheduler CPU {res['cpu_ms']:4.0f} ms/pod", flush=True)
                left = clean_namespace(clients, f"run-{tag}")
                if args.prefill:
                    left += clean_namespace(clients, f"fill-{tag}")
                if left:
                    print(f"  warning: {left} claims of run {tag} still exist 120 s after their pods were deleted")
                if args.lone and i < len(shapes) * len(modes) and shape in args.lone_shapes.split(","):
                    lone_runs(clients, tag, shape, args, nodes, fleet, workload)
            print(f"  {size} nodes: RSS GiB: {rss_gib(cp)}; load average "
                  f"{', '.join(f'{x:.2f}' for x in os.getloadavg())}", flush=True)
            summarise(size, results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
