"""Every manifest in examples/ applied AS SHIPPED (no field changed) on the rig, with the charts it needs installed
as the seeds install them plus the rig's two flags (``image.pullPolicy=Never``, ``fakeHost.path``): each workload
pod reaches Running with the devices it asked for, read from the container's own ``/dev`` and environment, and
deleting the example (default grace period) takes less than 10 s.

- examples/neuron-dra (but ultraserver/) and examples/efa-dra (but the p5 one) on one containerd trn2.48xlarge node
  with the Neuron DRA driver and the EFA DRA driver; examples/efa-dra/p5-4-efa-one-pcie-root.yaml on a containerd
  p5.48xlarge node with the EFA DRA driver.
- examples/neuron-dra/ultraserver needs 4 UltraServer nodes (trn2u.48xlarge). Four containerd nodes do not fit this
  2-core machine beside the control plane, so these run on four fakecri kubelet nodes (real kubelet, scheduler and
  controller-manager, a DRA driver per node; the containers are fakecri's). fakecri proves the kubelet and scheduler
  side: placement, allocation, prepare and delete.
- The neuron chart's scheduler extender (``scheduler.enabled=true``): ``my-scheduler`` runs the kube-scheduler image
  made from the cached binary under the chart's default reference, becomes Available on a containerd node, and
  binds a ``neuron: 1`` pod through the extender, reached at its Service name (the rig's cluster DNS and ClusterIP
  forwarding, rig/accel_rig/nodeservices.py).

Expected values are AWS facts, not our catalog's: a trn2.48xlarge has 16 Trainium2 devices and 16 EFAs (one per
device), a p5.48xlarge 32 EFAs, four on each GPU's PCIe root (efa.md 2.3); LNC 1 shows as NEURON_LOGICAL_NC_CONFIG=1;
a trn2u UltraServer has 4 nodes (node ids 0..3) and 2-node sets of nodes {0, 1} and {2, 3} (neuron.md 1.3).
"""

from __future__ import annotations

import contextlib
import json
import re
import subprocess
import tarfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from accel_rig.containerdnode import RuntimeBinaries
from accel_rig.controlplane import ControlPlane
from accel_rig.nodelayout import CONTAINERD
from chart_render import EFA_CHART, NEURON_CHART, SEED_DEVICE_PLUGIN_INSTALL, SEED_DRA_INSTALL
from conftest import Daemon, RealNode
from dra_support import NEURON as NEURON_DRIVER
from dra_support import chart_objects, node_slices, wait_namespace_gone
from kube_helpers import cdi_edits, pcie_root_of_uverbs, pod_events
from lightkube import ApiError, Client, codecs
from lightkube.resources.apps_v1 import Deployment
from lightkube.resources.core_v1 import Node, Pod
from lightkube.resources.resource_v1 import ResourceClaim
from runtime_helpers import REPO, Helm, rig_flags, running_1_of_1

from neuron_dra.facts.ultraserver import fake_ids

Wait = Callable[..., Any]
NodeFactory = Callable[..., RealNode]
EXAMPLES = REPO / "examples"
EFA_DRIVER = "efa.aws.com"
DELETE_WITHIN_S = 10.0
TRN2, P5, ULTRASERVER = "trn2 containerd", "p5 containerd", "trn2u fakecri"


@dataclass(frozen=True)
class Expect:
    """Where an example runs, and what each of its workload containers gets (AWS facts)."""

    rig: str
    neurons: int = 0
    efa: int = 0
    env: tuple[tuple[str, str], ...] = ()


LNC1 = (("NEURON_LOGICAL_NC_CONFIG", "1"),)
PLAN = {
    "neuron-dra/1x4-connected-neurons.yaml": Expect(TRN2, neurons=4),
    "neuron-dra/all-neurons.yaml": Expect(TRN2, neurons=16),
    "neuron-dra/all-neurons-lnc-1.yaml": Expect(TRN2, neurons=16, env=LNC1),
    "neuron-dra/eight-or-four-connected-neurons.yaml": Expect(TRN2, neurons=8, env=LNC1),  # 8 free: the first choice
    "neuron-dra/trn2-else-trn1.yaml": Expect(TRN2, neurons=16, env=LNC1),
    "neuron-dra/monitoring-admin-access.yaml": Expect(TRN2, neurons=16),
    "efa-dra/1-neuron-with-its-efa.yaml": Expect(TRN2, neurons=1, efa=1),
    "efa-dra/trn2-4-neurons-with-their-efa.yaml": Expect(TRN2, neurons=4, efa=4),
    "efa-dra/all-efa-shared.yaml": Expect(TRN2, efa=16),
    "efa-dra/monitoring-admin-access.yaml": Expect(TRN2, efa=16),
    "efa-dra/p5-4-efa-one-pcie-root.yaml": Expect(P5, efa=4),
    "neuron-dra/ultraserver/4-node-ultraserver.yaml": Expect(ULTRASERVER, neurons=16),
    "neuron-dra/ultraserver/2-node-ultraserver.yaml": Expect(ULTRASERVER, neurons=16),
}


def example_docs(rel: str) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all((EXAMPLES / rel).read_text()) if d]


def test_every_example_has_a_rig() -> None:
    """A new example must be added to PLAN (and so be applied by these tests)."""
    shipped = {p.relative_to(EXAMPLES).as_posix() for p in EXAMPLES.rglob("*.y*ml")}
    assert shipped == set(PLAN), f"not in PLAN: {sorted(shipped - set(PLAN))}; gone: {sorted(set(PLAN) - shipped)}"


def test_examples_name_an_image_the_rig_imports() -> None:
    """Every container image the examples name is one the rig's busybox archive carries (scripts/build-images.sh
    adds each busybox reference of examples/), with a pull policy that uses it (``:latest`` alone means Always)."""
    names = _archive_names(RuntimeBinaries.default().images / "busybox.oci.tar")
    for rel in PLAN:
        for c in _containers(example_docs(rel)):
            assert c["image"] in names, (rel, c["image"], names)
            assert c.get("imagePullPolicy") == "IfNotPresent", (rel, c)


def _archive_names(archive: Path) -> set[str]:
    if not archive.is_file():
        pytest.skip(f"{archive} not built (make image)")
    with tarfile.open(archive) as tar:
        member = tar.extractfile("index.json")
        assert member is not None
        index = json.load(member)
    return {m["annotations"]["io.containerd.image.name"] for m in index["manifests"]}


def _containers(docs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out = []
    for d in docs:
        spec = d.get("spec", {})
        pod_spec = spec.get("template", {}).get("spec") if d["kind"] in ("DaemonSet", "StatefulSet") else spec
        if d["kind"] in ("Pod", "DaemonSet", "StatefulSet"):
            out += pod_spec["containers"]
    return out


# -- applying an example as shipped ------------------------------------------------------------------------------------
@dataclass
class Applied:
    """An example's objects as created, and how to find its workload pods."""

    objects: list[tuple[Any, str | None]]
    pods: list[tuple[str, str | dict[str, str]]]  # (namespace, pod name or the label selector of its controller)


def apply_example(client: Client, rel: str, namespace: str) -> Applied:
    """Create every object of the example unchanged; objects without a namespace go to ``namespace``."""
    applied = Applied([], [])
    for doc in example_docs(rel):
        obj = codecs.from_dict(doc)
        if doc["kind"] == "Namespace":
            wait_namespace_gone(client, doc["metadata"]["name"])
            client.create(obj)
            applied.objects.append((obj, None))
            continue
        ns = doc["metadata"].get("namespace", namespace)
        client.create(obj, namespace=ns)  # type: ignore[call-overload]
        applied.objects.append((obj, ns))
        if doc["kind"] == "Pod":
            applied.pods.append((ns, doc["metadata"]["name"]))
        elif doc["kind"] in ("DaemonSet", "StatefulSet"):
            applied.pods.append((ns, doc["spec"]["selector"]["matchLabels"]))
    return applied


def workload_pods(client: Client, applied: Applied) -> list[dict[str, Any]]:
    out = []
    for ns, which in applied.pods:
        if isinstance(which, str):
            with contextlib.suppress(ApiError):
                out.append(client.get(Pod, which, namespace=ns).to_dict())
        else:
            out += [p.to_dict() for p in client.list(Pod, namespace=ns, labels=which)]
    return out


def wait_running(client: Client, applied: Applied, count: int, rel: str, wait: Wait,
                 timeout: float = 180) -> list[dict[str, Any]]:
    def check() -> list[dict[str, Any]] | None:
        pods = workload_pods(client, applied)
        return pods if len(pods) == count and all(running_1_of_1(p) for p in pods) else None

    try:
        found: list[dict[str, Any]] = wait(check, f"{count} pod(s) of {rel} Running", timeout=timeout)
    except TimeoutError as exc:
        states = {p["metadata"]["name"]: (p.get("status", {}).get("phase"),
                                          [s.get("state") for s in p.get("status", {}).get("containerStatuses") or []])
                  for p in workload_pods(client, applied)}
        raise AssertionError(f"{rel}: {states}") from exc
    return found


def delete_example(client: Client, applied: Applied, wait: Wait) -> float:
    """Delete the example's objects as ``kubectl delete -f`` does (default grace period, background cascade);
    return the seconds until its last workload pod is gone from the API server."""
    t0 = time.monotonic()
    for obj, ns in reversed(applied.objects):
        with contextlib.suppress(ApiError):
            if ns is None:
                client.delete(type(obj), obj.metadata.name)
            else:
                client.delete(type(obj), obj.metadata.name, namespace=ns)
    wait(lambda: not workload_pods(client, applied), "the example's pods gone", timeout=60, interval=0.1)
    elapsed = time.monotonic() - t0
    for obj, ns in applied.objects:
        if ns is None:
            wait_namespace_gone(client, obj.metadata.name)
    return elapsed




# -- what a container got, read from its own process ----------------------------------------------------------------
@dataclass(frozen=True)
class Seen:
    neurons: list[int]
    uverbs: list[str]
    env: dict[str, str]


def container_pid(node: RealNode, pod: dict[str, Any]) -> str:
    """The machine PID of the pod's (first) container's process, from containerd."""
    cid = pod["status"]["containerStatuses"][0]["containerID"].removeprefix("containerd://")
    listing = node.kubelet.containerd.ctr("tasks", "list").stdout.splitlines()
    (pid,) = [line.split()[1] for line in listing if line.startswith(cid)]
    return str(pid)


def container_sees(node: RealNode, pod: dict[str, Any]) -> Seen:
    """The device nodes in the container's own /dev and its PID 1's environment, through /proc of the machine (the
    PID from containerd)."""
    pid = container_pid(node, pod)
    dev = Path(f"/proc/{pid}/root/dev")
    neurons = sorted(int(m.group(1)) for p in dev.glob("neuron*") if (m := re.fullmatch(r"neuron(\d+)", p.name)))
    uverbs = sorted((p.name for p in (dev / "infiniband").glob("uverbs*")), key=lambda n: int(n[6:]))
    environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    env = dict(e.decode().split("=", 1) for e in environ if b"=" in e)
    return Seen(neurons, uverbs, env)


def claim_devices(client: Client, pod: dict[str, Any], driver: str) -> list[str]:
    """The devices of ``driver`` allocated to the pod's claim (templated or shared)."""
    ns = pod["metadata"]["namespace"]
    statuses = pod.get("status", {}).get("resourceClaimStatuses") or []
    names = [s["resourceClaimName"] for s in statuses if s.get("resourceClaimName")]
    names += [c["resourceClaimName"] for c in pod["spec"].get("resourceClaims", []) if c.get("resourceClaimName")]
    out: list[str] = []
    for name in names:
        claim = client.get(ResourceClaim, name, namespace=ns).to_dict()
        out += [r["device"] for r in claim["status"]["allocation"]["devices"]["results"] if r["driver"] == driver]
    return sorted(out)


def check_containers(client: Client, node: RealNode, rel: str, pods: list[dict[str, Any]]) -> None:
    want = PLAN[rel]
    for pod in pods:
        seen = container_sees(node, pod)
        name = pod["metadata"]["name"]
        assert len(seen.neurons) == want.neurons, (rel, name, seen)
        assert len(seen.uverbs) == want.efa, (rel, name, seen)
        # the container's /dev/neuronN are the devices kube-scheduler allocated (neuron-device-N)
        allocated = claim_devices(client, pod, NEURON_DRIVER.driver)
        assert sorted(int(d.removeprefix("neuron-device-")) for d in allocated) == seen.neurons, (rel, name, allocated)
        assert len(claim_devices(client, pod, EFA_DRIVER)) == want.efa, (rel, name)
        for key, value in want.env:
            assert seen.env.get(key) == value, (rel, name, key, seen.env)
        if want.neurons:
            assert seen.env.get("NEURON_RT_VISIBLE_CORES"), (rel, name, seen.env)


def run_examples(client: Client, node: RealNode, rels: list[str], namespace: str, wait: Wait) -> dict[str, float]:
    """Apply, check and delete each example in turn; return each one's delete time."""
    deleted: dict[str, float] = {}
    for rel in rels:
        applied = apply_example(client, rel, namespace)
        try:
            pods = wait_running(client, applied, 2 if rel.endswith("all-efa-shared.yaml") else 1, rel, wait)
            check_containers(client, node, rel, pods)
        finally:
            deleted[rel] = delete_example(client, applied, wait)
        # the claims go with the pods (templated) or with the example (shared): the next example finds all free
        wait(lambda: not list(client.list(ResourceClaim, namespace=namespace)), f"the claims of {rel} gone")
    return deleted


def report(deleted: dict[str, float]) -> None:
    for rel, seconds in deleted.items():
        print(f"\n[figure] kubectl delete -f examples/{rel}: pods gone in {seconds:.1f}s")
    slow = {rel: round(s, 1) for rel, s in deleted.items() if s >= DELETE_WITHIN_S}
    assert not slow, f"deletes over {DELETE_WITHIN_S}s: {slow}"


@pytest.fixture
def helm(control_plane: ControlPlane, tmp_path: Path) -> Helm:
    return Helm(control_plane, tmp_path)


def _uninstall(helm: Helm, release: str, namespace: str) -> None:
    with contextlib.suppress(AssertionError):
        helm("uninstall", release, "--namespace", namespace, "--wait", "--timeout", "120s")


def _slice_devices(client: Client, node: str, driver: str) -> int:
    return sum(len(s["spec"].get("devices") or []) for s in node_slices(client, node, driver))


@pytest.mark.containerd
@pytest.mark.timeout(1500)
def test_trn2_examples_as_shipped(kubelet_node: NodeFactory, kube_client: Client, helm: Helm, namespace: str,
                                  wait: Wait) -> None:
    trn2 = kubelet_node("trn2.48xlarge", runtime=CONTAINERD)
    assert "public.ecr.aws/docker/library/busybox:latest" in trn2.kubelet.containerd.images()
    helm.seed(SEED_DRA_INSTALL, NEURON_CHART, *rig_flags(trn2.kubelet))
    try:
        helm("upgrade", "--install", "aws-efa-k8s-device-plugin", str(EFA_CHART), "--namespace", "kube-system",
             "--set", "devicePlugin.enabled=false", "--set", "draDriver.enabled=true", *rig_flags(trn2.kubelet))
        try:
            wait(lambda: _slice_devices(kube_client, trn2.name, NEURON_DRIVER.driver) == 16
                 and _slice_devices(kube_client, trn2.name, EFA_DRIVER) == 16,
                 "16 Neuron devices and 16 EFAs published by the drivers' pods", timeout=240)
            rels = [rel for rel, e in PLAN.items() if e.rig == TRN2]
            report(run_examples(kube_client, trn2, rels, namespace, wait))
        finally:
            _uninstall(helm, "aws-efa-k8s-device-plugin", "kube-system")
    finally:
        _uninstall(helm, "neuron-helm-chart", "neuron-dra-driver")


@pytest.mark.containerd
@pytest.mark.timeout(900)
def test_p5_example_as_shipped(kubelet_node: NodeFactory, kube_client: Client, helm: Helm, namespace: str,
                               wait: Wait) -> None:
    p5 = kubelet_node("p5.48xlarge", runtime=CONTAINERD)
    helm("upgrade", "--install", "aws-efa-k8s-device-plugin", str(EFA_CHART), "--namespace", "kube-system",
         "--set", "devicePlugin.enabled=false", "--set", "draDriver.enabled=true", *rig_flags(p5.kubelet))
    try:
        wait(lambda: _slice_devices(kube_client, p5.name, EFA_DRIVER) == 32, "32 EFAs published", timeout=240)
        rel = "efa-dra/p5-4-efa-one-pcie-root.yaml"
        applied = apply_example(kube_client, rel, namespace)
        try:
            (pod,) = wait_running(kube_client, applied, 1, rel, wait)
            check_containers(kube_client, p5, rel, [pod])
            uverbs = container_sees(p5, pod).uverbs
            roots = {pcie_root_of_uverbs(p5.kubelet.layout.host_root, u) for u in uverbs}
            assert len(roots) == 1, (uverbs, roots)  # four EFAs on one PCIe root (efa.md 2.3)
        finally:
            deleted = {rel: delete_example(kube_client, applied, wait)}
        report(deleted)
    finally:
        _uninstall(helm, "aws-efa-k8s-device-plugin", "kube-system")


# -- UltraServer examples on fakecri kubelet nodes ---------------------------------------------------------------------
TRN2U = "trn2u.48xlarge"
US_PREFIX = "neuron.amazonaws.com/ultraserver-"
DRA_FLAGS = ("--set", "devicePlugin.enabled=false", "--set", "draDriver.enabled=true", "--set", "npd.enabled=false")


@pytest.fixture
def ultraserver(control_plane: ControlPlane, kube_client: Client, kubelet_node: NodeFactory,
                daemon: Callable[..., Daemon], wait: Wait) -> Iterator[list[RealNode]]:
    """One UltraServer: 4 fakecri kubelet nodes (node ids 0..3), each with its Neuron DRA driver publishing 16 chips
    and the node device, and labelling its Node with the UltraServer ids."""
    with chart_objects(control_plane, kube_client, NEURON_CHART, DRA_FLAGS):
        nodes = []
        for k in range(4):
            node = kubelet_node(TRN2U)
            node.host.set_ultraserver(fake_ids("us-examples", k))
            daemon("neuron-dra-driver", "serve", "--metrics-port", "0", "--healthcheck-port", "-1",
                   "--rescan-interval", "1", env=node.env(POD_UID=f"dra-us-{k}"))
            nodes.append(node)
        for node in nodes:
            wait(lambda n=node: _slice_devices(kube_client, n.name, NEURON_DRIVER.driver) == 17
                 and f"{US_PREFIX}server-id-4" in (kube_client.get(Node, n.name).metadata.labels or {}),
                 f"17 devices and the UltraServer labels of {node.name}", timeout=120)
        yield nodes


@pytest.mark.timeout(900)
def test_ultraserver_examples_as_shipped(kube_client: Client, ultraserver: list[RealNode], namespace: str,
                                         wait: Wait) -> None:
    labels = {n.name: kube_client.get(Node, n.name).metadata.labels or {} for n in ultraserver}
    by_name = {n.name: n for n in ultraserver}
    deleted = {}
    for rel, replicas in (("neuron-dra/ultraserver/4-node-ultraserver.yaml", 4),
                          ("neuron-dra/ultraserver/2-node-ultraserver.yaml", 2)):
        applied = apply_example(kube_client, rel, namespace)
        try:
            pods = wait_running(kube_client, applied, replicas, rel, wait)
            where = [p["spec"]["nodeName"] for p in pods]
            assert len(set(where)) == replicas, (rel, where)  # one pod per node
            key = "server-id-4" if replicas == 4 else "server-id-2"
            assert len({labels[n][f"{US_PREFIX}{key}"] for n in where}) == 1, (rel, where)  # one set
            if replicas == 2:
                assert {int(labels[n][f"{US_PREFIX}node-id-4"]) // 2 for n in where} in ({0}, {1}), where
            for pod in pods:  # each claim: its own node's neuron_node device (all 16 chips)
                ns, node = pod["metadata"]["namespace"], pod["spec"]["nodeName"]
                (status,) = pod["status"]["resourceClaimStatuses"]
                claim = kube_client.get(ResourceClaim, status["resourceClaimName"], namespace=ns).to_dict()
                results = claim["status"]["allocation"]["devices"]["results"]
                assert [(r["pool"], r["device"]) for r in results] == [(node, "neuron-node")]
                # what the kubelet gave the container (fakecri's record, resolved through the driver's CDI spec):
                # the node's 16 chips and the UltraServer mode and node id (neuron.md 1.3: mode 1 = X4, 2 = X2H)
                (ctr,) = by_name[node].kubelet.containers(pod["metadata"]["name"], ns)
                devices, env = cdi_edits(by_name[node].kubelet.layout.cdi_root, ctr.cdi_devices)
                assert devices == {f"/dev/neuron{i}" for i in range(PLAN[rel].neurons)}, (rel, devices)
                assert env["NEURON_RT_ULTRASERVER_MODE"] == ("1" if replicas == 4 else "2"), (rel, env)
                assert env["NEURON_RT_ULTRASERVER_NODE_ID"] == labels[node][f"{US_PREFIX}node-id-{replicas}"], env
        finally:
            deleted[rel] = delete_example(kube_client, applied, wait)
        wait(lambda: not list(kube_client.list(ResourceClaim, namespace=namespace)), f"the claims of {rel} gone")
    report(deleted)


# -- the scheduler extender chart ----------------------------------------------------------------------------------
def deployment_available(client: Client, namespace: str, name: str) -> bool:
    status = client.get(Deployment, name, namespace=namespace).to_dict().get("status", {})
    conditions = {c["type"]: c["status"] for c in status.get("conditions") or []}
    return conditions.get("Available") == "True" and status.get("availableReplicas") == 1


SLEEPER = {"name": "app", "image": "public.ecr.aws/docker/library/busybox:latest", "imagePullPolicy": "IfNotPresent",
           "command": ["sh", "-c", "trap 'exit 0' TERM; sleep infinity & wait"]}


@pytest.mark.containerd
@pytest.mark.timeout(900)
def test_scheduler_extender_chart_runs_my_scheduler(control_plane: ControlPlane, kubelet_node: NodeFactory,
                                                    kube_client: Client, helm: Helm, namespace: str,
                                                    wait: Wait) -> None:
    """The seed's device-plugin install plus ``scheduler.enabled=true`` on a containerd trn2 node: my-scheduler runs
    the chart's default image (``registry.k8s.io/kube-scheduler:<the API server's version>``, made by the rig from
    the cached binary) as the chart confines it (uid 65532, read-only root), becomes Available (its HTTPS /healthz
    readiness probe), binds a pod that names it, and binds a ``neuron: 1`` pod through the extender (the rig's
    cluster DNS and ClusterIP forwarding carry my-scheduler's call to the extender's Service)."""
    trn2 = kubelet_node("trn2.48xlarge", runtime=CONTAINERD)
    image = f"registry.k8s.io/kube-scheduler:{_server_version(control_plane)}"
    assert image in trn2.kubelet.containerd.images()
    helm.seed(SEED_DEVICE_PLUGIN_INSTALL, NEURON_CHART, *rig_flags(trn2.kubelet), "--set", "scheduler.enabled=true")
    try:
        for name in ("my-scheduler", "neuron-scheduler-extender"):
            wait(lambda n=name: deployment_available(kube_client, "kube-system", n), f"{name} Available",
                 timeout=240)
        (pod,) = [p.to_dict() for p in kube_client.list(Pod, namespace="kube-system",
                                                          labels={"app.kubernetes.io/name": "my-scheduler"})]
        assert pod["spec"]["containers"][0]["image"] == image
        assert running_1_of_1(pod)
        # the chart's securityContext as the kernel applies it to kube-scheduler's own process
        pid = container_pid(trn2, pod)
        status = dict(line.split(":\t", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines()
                      if ":\t" in line)
        root = next(line.split() for line in Path(f"/proc/{pid}/mountinfo").read_text().splitlines()
                    if line.split()[4] == "/")
        assert Path(f"/proc/{pid}/exe").resolve().name == "kube-scheduler"
        assert (status["Uid"].split()[1], status["CapEff"].strip(), root[5].split(",")[0]) == (
            "65532", "0000000000000000", "ro"), (status["Uid"], status["CapEff"], root)

        # my-scheduler binds a pod that names it (no Neuron request: the extender is not consulted).
        kube_client.create(Pod.from_dict({  # type: ignore[call-overload]
            "metadata": {"name": "by-my-scheduler", "namespace": namespace},
            "spec": {"schedulerName": "my-scheduler", "containers": [SLEEPER]}}))
        wait(lambda: running_1_of_1(kube_client.get(Pod, "by-my-scheduler", namespace=namespace).to_dict()),
             "the pod bound by my-scheduler and Running", timeout=120)

        # A neuron: 1 pod: my-scheduler asks the extender (which manages aws.amazon.com/neuron) at its Service name,
        # over mutual TLS; the node's cluster DNS resolves the name and its ClusterIP reaches the extender pod.
        wait(lambda: allocatable_neuron(kube_client, trn2.name) == 16, "neuron: 16 allocatable", timeout=180)
        kube_client.create(Pod.from_dict({  # type: ignore[call-overload]
            "metadata": {"name": "neuron-1", "namespace": namespace},
            "spec": {"schedulerName": "my-scheduler",
                     "containers": [{**SLEEPER, "resources": {"limits": {"aws.amazon.com/neuron": "1"}}}]}}))
        wait(lambda: running_1_of_1(kube_client.get(Pod, "neuron-1", namespace=namespace).to_dict()),
             "the neuron: 1 pod bound by my-scheduler and Running", timeout=180)
        events = pod_events(kube_client, namespace, "neuron-1")
        print(f"\n[rig] my-scheduler, neuron: 1 pod: {events}")
        assert kube_client.get(Pod, "neuron-1", namespace=namespace).spec.nodeName == trn2.name
        assert any(r == "Scheduled" for r, _ in events), events
        # A filter call made before the node's view of the Service has the extender's endpoint (refreshed every 2 s)
        # fails and the scheduler retries (CI saw one "connection reset by peer"); only the extender may be named.
        failed = [m for r, m in events if r == "FailedScheduling"]
        assert all("neuron-scheduler-extender" in m for m in failed), events
        # the extender answered my-scheduler's filter call for it, passing the node (its own log)
        (extender,) = [p.metadata.name for p in kube_client.list(
            Pod, namespace="kube-system", labels={"app.kubernetes.io/name": "neuron-scheduler-extender"})]
        log = trn2.kubelet.pod_log("kube-system", extender, "neuron-scheduler-extender")
        calls = [line for line in log.splitlines() if "msg=filter" in line and f"pod={namespace}/neuron-1 " in line]
        print(f"[rig] the extender's filter call: {calls}")
        assert any(f"passed={trn2.name}" in line for line in calls), log[-2000:]
    finally:
        _uninstall(helm, "neuron-helm-chart", "default")


def allocatable_neuron(client: Client, node: str) -> int:
    status = client.get(Node, node).status
    return int(((status.allocatable if status is not None else None) or {}).get("aws.amazon.com/neuron", 0))


def _server_version(control_plane: ControlPlane) -> str:
    """The API server's gitVersion, as ``kubectl version`` reads it."""
    out = subprocess.run([str(control_plane.kubectl), "--kubeconfig", str(control_plane.admin_kubeconfig), "version",
                          "-o", "json"], capture_output=True, text=True, timeout=60, check=True)
    return str(json.loads(out.stdout)["serverVersion"]["gitVersion"])
