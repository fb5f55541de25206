"""Kubernetes 1.37 DRA features as users use them, with the REAL kubelet, kube-scheduler and kube-controller-manager
on fake nodes, for both DRA drivers (neuron.aws.com, efa.aws.com):

- admin access: a monitoring DaemonSet from examples/*-dra/monitoring-admin-access.yaml runs beside a workload on
  the same devices, in either order, and removing either leaves the other prepared;
- device status: the drivers, with the chart's ClusterRole and a pod-bound token, write status.devices;
- extended resources backed by DRA: a ``aws.amazon.com/neuron: 4`` pod and the seed's nccl-tests worker
  (``vpc.amazonaws.com/efa: 32``) run unchanged on DRA nodes, served through the DeviceClasses'
  extendedResourceName (chart value draDriver.extendedResource);
- prioritized lists: examples/neuron-dra/eight-or-four-connected-neurons.yaml gets 8, then falls back to 4, and a
  config naming the parent or the chosen subrequest reaches the containers; trn2-else-trn1.yaml on either type;
- the unhealthy taint effect NoExecute: kube-controller-manager evicts the pod whose device turns unhealthy (and
  stays so for ``--noexecute-after``; NoSchedule until then).

Facts the assertions use (not our code): trn2.48xlarge has 16 Neuron devices (/dev/neuron0..15) with 8 physical
NeuronCores each (4 logical at the default LNC 2, 8 at LNC 1); its devicegroup8 sets are devices 0-7 and 8-15 and
its devicegroup4 sets are rows of four (neuron.md); p5.48xlarge has 32 EFAs (efa.md); a CDI device name is
``<kind>=<device name>``, resolved from a spec file in the CDI directory.
"""

from __future__ import annotations

import contextlib
import json
import subprocess
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from accel_rig.controlplane import ControlPlane
from conftest import REPO_ROOT, Daemon, RealNode
from dra_support import EFA as SUPPORT_EFA
from dra_support import NEURON as SUPPORT_NEURON
from dra_support import chart_objects, pod_bound_kubeconfig, pod_claim_name
from kube_helpers import NEURON as NEURON_RESOURCE
from kube_helpers import allocatable, cdi_edits, create_pod, pod_gone, pod_phase
from lightkube import ApiError, Client, codecs
from lightkube.resources.apps_v1 import DaemonSet
from lightkube.resources.core_v1 import Namespace, Pod
from lightkube.resources.resource_v1 import DeviceClass, ResourceClaim, ResourceSlice

Wait = Callable[..., Any]
MakeNode = Callable[..., RealNode]
StartDaemon = Callable[..., Daemon]
ADMIN_LABEL = "resource.kubernetes.io/admin-access"


@dataclass(frozen=True)
class Kind:
    driver: str
    console: str
    instance_type: str
    devices: int  # published on that instance type (neuron.md, efa.md)
    device_class: str
    node_prefix: str  # the device node every device of the driver has
    examples: str


NEURON = Kind("neuron.aws.com", "neuron-dra-driver", "trn2.48xlarge", 16, "neuron.aws.com", "/dev/neuron",
              "neuron-dra")
EFA = Kind("efa.aws.com", "efa-dra-driver", "p5.48xlarge", 32, "efa.networking.k8s.aws", "/dev/infiniband/uverbs",
           "efa-dra")
CHARTS = {NEURON: ("charts/neuron-helm-chart", ("--set", "devicePlugin.enabled=false", "--set", "npd.enabled=false")),
          EFA: ("charts/aws-efa-k8s-device-plugin", ("--set", "devicePlugin.enabled=false"))}


def rendered_classes(control_plane: ControlPlane, *flags: str) -> list[dict[str, Any]]:
    """Both charts' DeviceClasses, rendered with helm as users install them (``flags`` go to both)."""
    out: list[dict[str, Any]] = []
    for chart, chart_flags in CHARTS.values():
        run = subprocess.run([str(control_plane.helm), "template", "x", str(REPO_ROOT / chart),
                              "--set", "draDriver.enabled=true", *chart_flags, *flags],
                             capture_output=True, text=True, timeout=120, check=True)
        out += [d for d in yaml.safe_load_all(run.stdout) if d and d.get("kind") == "DeviceClass"]
    return out


@contextlib.contextmanager
def device_classes(client: Client, docs: list[dict[str, Any]]) -> Iterator[None]:
    """Create (or replace) the classes; delete them afterwards (other modules create their own)."""
    for doc in docs:
        with contextlib.suppress(ApiError):
            client.delete(DeviceClass, doc["metadata"]["name"])
        client.create(codecs.from_dict(doc))
    try:
        yield
    finally:
        for doc in docs:
            with contextlib.suppress(ApiError):
                client.delete(DeviceClass, doc["metadata"]["name"])


@pytest.fixture(scope="module")
def classes(control_plane: ControlPlane, kube_client: Client) -> Iterator[None]:
    with device_classes(kube_client, rendered_classes(control_plane, "--set", "draDriver.extendedResource=true")):
        yield


def start_driver(daemon: StartDaemon, node: RealNode, kind: Kind, *args: str) -> Daemon:
    return daemon(kind.console, "serve", "--metrics-port", "0", "--healthcheck-port", "-1", "--rescan-interval", "1",
                  *args, env=node.env(POD_UID=f"{kind.console}-pod"))


def published(client: Client, node: str, kind: Kind) -> int:
    return sum(len(s.spec.devices or []) for s in client.list(ResourceSlice, fields={"spec.nodeName": node,
                                                                                      "spec.driver": kind.driver}))


def ready_node(kubelet_node: MakeNode, daemon: StartDaemon, client: Client, kind: Kind, wait: Wait,
               *driver_args: str) -> tuple[RealNode, Daemon]:
    node = kubelet_node(kind.instance_type)
    driver = start_driver(daemon, node, kind, *driver_args)
    wait(lambda: published(client, node.name, kind) == kind.devices, f"{kind.devices} devices published", timeout=60)
    wait(lambda: "kubelet registered the DRA plugin" in driver.tail(200), "the kubelet's registration", timeout=30)
    return node, driver


def cdi_nodes(cdi_root: Path, names: tuple[str, ...]) -> set[str]:
    return cdi_edits(cdi_root, names)[0]


def example(kind: Kind, name: str) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all((REPO_ROOT / "examples" / kind.examples / name).read_text()) if d]


def create_in(client: Client, namespace: str, doc: dict[str, Any]) -> None:
    doc = json.loads(json.dumps(doc))
    doc["metadata"]["namespace"] = namespace
    client.create(codecs.from_dict(doc), namespace=namespace)  # type: ignore[call-overload]


def all_devices_template(name: str, kind: Kind) -> dict[str, Any]:
    """A workload's claim on every device of the node (no admin access): the monitor shares all of them."""
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate", "metadata": {"name": name},
            "spec": {"spec": {"devices": {"requests": [{"name": "all", "exactly": {
                "deviceClassName": kind.device_class, "allocationMode": "All"}}]}}}}


def container_nodes(node: RealNode, pod: str, namespace: str, kind: Kind) -> set[str]:
    (ctr,) = node.kubelet.containers(pod, namespace)
    return {p for p in cdi_nodes(node.kubelet.layout.cdi_root, ctr.cdi_devices) if p.startswith(kind.node_prefix)}


def claim_specs(node: RealNode, kind: Kind) -> set[Path]:
    return set(node.kubelet.layout.cdi_root.glob(f"k8s.{kind.driver}-claim_*.json"))


# -- 1. admin access -------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("admin_first", [True, False], ids=["monitor-first", "workload-first"])
@pytest.mark.parametrize("kind", [NEURON, EFA], ids=["neuron", "efa"])
def test_admin_access_monitor_runs_beside_the_workload(kubelet_node: MakeNode, daemon: StartDaemon,
                                                       kube_client: Client, classes: None, namespace: str,
                                                       wait: Wait, kind: Kind, admin_first: bool) -> None:
    node, _ = ready_node(kubelet_node, daemon, kube_client, kind, wait)
    kube_client.patch(Namespace, namespace, {"metadata": {"labels": {ADMIN_LABEL: "true"}}})
    docs = {d["kind"]: d for d in example(kind, "monitoring-admin-access.yaml")}
    assert docs["Namespace"]["metadata"]["labels"] == {ADMIN_LABEL: "true"}
    daemonset = json.loads(json.dumps(docs["DaemonSet"]))
    daemonset["spec"]["template"]["spec"]["nodeSelector"] = {"kubernetes.io/hostname": node.name}
    create_in(kube_client, namespace, docs["ResourceClaimTemplate"])
    create_in(kube_client, namespace, all_devices_template("everything", kind))
    every = {f"{kind.node_prefix}{i}" for i in range(kind.devices)} if kind is NEURON else None

    def monitor_pod() -> str | None:
        for pod in kube_client.list(Pod, namespace=namespace, labels=daemonset["spec"]["selector"]["matchLabels"]):
            if pod.status is not None and pod.status.phase == "Running":
                return str(pod.metadata.name)  # type: ignore[union-attr]
        return None

    def start_monitor() -> str:
        create_in(kube_client, namespace, daemonset)
        name: str = wait(monitor_pod, "the monitoring DaemonSet's pod Running", timeout=120)
        return name

    def start_workload() -> None:
        create_pod(kube_client, namespace, "workload", node.name, claims=[("all", "everything")])
        wait(lambda: pod_phase(kube_client, namespace, "workload") == "Running", "the workload Running", timeout=120)

    if admin_first:
        monitor = start_monitor()
        start_workload()
    else:
        start_workload()
        monitor = start_monitor()
    seen = container_nodes(node, monitor, namespace, kind)
    held = container_nodes(node, "workload", namespace, kind)
    assert seen == held and len(seen) == kind.devices, (seen, held)
    if every is not None:
        assert seen == every
    specs = claim_specs(node, kind)
    assert len(specs) == 2, specs

    # Unprepare the one prepared first: the other stays prepared (its CDI spec stays, its container keeps running).
    if admin_first:
        kube_client.delete(DaemonSet, daemonset["metadata"]["name"], namespace=namespace)
        wait(lambda: monitor_pod() is None and pod_gone(kube_client, namespace, monitor), "the monitor gone",
             timeout=90)
        kept = "workload"
    else:
        kube_client.delete(Pod, "workload", namespace=namespace, grace_period=0)
        wait(lambda: pod_gone(kube_client, namespace, "workload"), "the workload gone", timeout=90)
        kept = monitor
    wait(lambda: len(claim_specs(node, kind)) == 1, "one claim unprepared by the kubelet", timeout=60)
    assert pod_phase(kube_client, namespace, kept) == "Running"
    assert container_nodes(node, kept, namespace, kind) == seen, "the other claim's CDI spec is intact"


def container_edits(node: RealNode, pod: str, namespace: str) -> tuple[set[str], dict[str, str]]:
    (ctr,) = node.kubelet.containers(pod, namespace)
    assert ctr.cdi_devices and not ctr.devices, "DRA devices reach the runtime as CDI names only"
    return cdi_edits(node.kubelet.layout.cdi_root, ctr.cdi_devices)


def neuron_indices(paths: set[str]) -> list[int]:
    return sorted(int(p.removeprefix("/dev/neuron")) for p in paths if p.startswith("/dev/neuron"))


def running(client: Client, namespace: str, pod: str, wait: Wait) -> None:
    wait(lambda: pod_phase(client, namespace, pod) == "Running", f"{pod} Running", timeout=120)


# -- 2. device-plugin pod specs served by DRA (extendedResourceName) -------------------------------------------------
def test_neuron_4_pod_runs_unchanged_on_a_dra_node(kubelet_node: MakeNode, daemon: StartDaemon, kube_client: Client,
                                                  classes: None, namespace: str, wait: Wait) -> None:
    node, _ = ready_node(kubelet_node, daemon, kube_client, NEURON, wait)
    assert allocatable(kube_client, node.name, NEURON_RESOURCE) is None, "no device plugin serves the node"
    create_pod(kube_client, namespace, "dp-spec", node.name, limits={NEURON_RESOURCE: "4"})
    running(kube_client, namespace, "dp-spec", wait)
    nodes, env = container_edits(node, "dp-spec", namespace)
    assert len(neuron_indices(nodes)) == 4, nodes
    assert env["NEURON_RT_VISIBLE_CORES"] == "0-15"  # 4 devices x 4 logical cores at the default LNC 2
    status = kube_client.get(Pod, "dp-spec", namespace=namespace).to_dict()["status"]
    claim = status["extendedResourceClaimStatus"]["resourceClaimName"]  # the scheduler's claim for the pod
    assert claim and status["extendedResourceClaimStatus"]["requestMappings"][0]["resourceName"] == NEURON_RESOURCE


def seed_nccl_worker() -> dict[str, Any]:
    """The worker container of the seed's nccl-tests MPIJob (Worker.template of the AWS EFA document), as users
    have it. Left out, since this machine cannot offer them: ``nvidia.com/gpu: 8`` (the issue's "without the GPU
    request": a fake p5 has no GPU driver), ``hugepages-2Mi: 5120Mi`` (the machine has no 2 MiB huge pages) and
    ``memory: 32000Mi`` (the machine has 23 GiB). ``vpc.amazonaws.com/efa: 32``, image, nodeSelector and the
    /dev/shm hostPath are as in the document."""
    efa = {"vpc.amazonaws.com/efa": "32"}
    return {"nodeSelector": {"node.kubernetes.io/instance-type": "p5.48xlarge"},
            "containers": [{"image": "public.ecr.aws/hpc-cloud/nccl-tests:latest", "imagePullPolicy": "IfNotPresent",
                            "name": "nccl-tests-worker", "volumeMounts": [{"name": "shmem", "mountPath": "/dev/shm"}],
                            "resources": {"limits": efa, "requests": efa}}],
            "volumes": [{"name": "shmem", "hostPath": {"path": "/dev/shm"}}]}


def test_seed_nccl_worker_runs_unchanged_on_an_efa_dra_node(kubelet_node: MakeNode, daemon: StartDaemon,
                                                            kube_client: Client, classes: None, namespace: str,
                                                            wait: Wait) -> None:
    node, _ = ready_node(kubelet_node, daemon, kube_client, EFA, wait)
    kube_client.create(Pod.from_dict({"metadata": {"name": "nccl-tests-worker-0", "namespace": namespace},  # type: ignore[call-overload]
                                      "spec": seed_nccl_worker()}))
    running(kube_client, namespace, "nccl-tests-worker-0", wait)
    nodes, _ = container_edits(node, "nccl-tests-worker-0", namespace)
    uverbs = {p for p in nodes if p.startswith("/dev/infiniband/uverbs")}
    assert len(uverbs) == 32 and "/dev/infiniband/rdma_cm" in nodes, nodes


# -- 3. prioritized lists --------------------------------------------------------------------------------------------
@pytest.mark.parametrize(("config_requests", "lnc1_for"), [(["neurons"], {"first", "second"}),
                                                           (["neurons/four"], {"second"})],
                         ids=["config-on-parent", "config-on-subrequest"])
def test_eight_connected_else_four(kubelet_node: MakeNode, daemon: StartDaemon, kube_client: Client, classes: None,
                                   namespace: str, wait: Wait, config_requests: list[str], lnc1_for: set[str]) -> None:
    node, _ = ready_node(kubelet_node, daemon, kube_client, NEURON, wait)
    docs = {d["kind"]: d for d in example(NEURON, "eight-or-four-connected-neurons.yaml")}
    template = json.loads(json.dumps(docs["ResourceClaimTemplate"]))
    template["spec"]["spec"]["devices"]["config"][0]["requests"] = config_requests
    create_in(kube_client, namespace, template)
    (hold,) = [d for d in example(NEURON, "1x4-connected-neurons.yaml") if d["kind"] == "ResourceClaimTemplate"]
    create_in(kube_client, namespace, hold)
    # 4 connected held first: one devicegroup8 set stays whole (8 for "first"), the other has 4 left ("second")
    create_pod(kube_client, namespace, "hold", node.name, claims=[("neurons", "1x4-connected-neurons")])
    running(kube_client, namespace, "hold", wait)
    got: dict[str, list[int]] = {"hold": neuron_indices(container_edits(node, "hold", namespace)[0])}
    for pod in ("first", "second"):
        create_pod(kube_client, namespace, pod, node.name, claims=[("neurons", "eight-or-four-connected-neurons")])
        running(kube_client, namespace, pod, wait)
        nodes, env = container_edits(node, pod, namespace)
        got[pod] = neuron_indices(nodes)
        lnc = 1 if pod in lnc1_for else 2
        assert env.get("NEURON_LOGICAL_NC_CONFIG") == ("1" if lnc == 1 else None), (pod, env)
        assert env["NEURON_RT_VISIBLE_CORES"] == f"0-{len(got[pod]) * 8 // lnc - 1}", (pod, env)
    assert (len(got["first"]), len(got["second"])) == (8, 4), got
    assert {d // 8 for d in got["first"]} != {d // 8 for d in got["hold"]}, got  # the whole group of 8
    assert len({d // 4 for d in got["second"]}) == 1, got  # one connected row of 4
    assert not set(got["hold"]) & set(got["first"]) | set(got["hold"]) & set(got["second"]), got


def test_config_naming_the_chosen_subrequest_reaches_only_its_request(
        kubelet_node: MakeNode, daemon: StartDaemon, kube_client: Client, classes: None, namespace: str,
        wait: Wait) -> None:
    """With a second request in the claim the scheduler keeps the config's ``requests: [neurons/eight]`` as written
    (with one request it clears them: the config then covers every request), so the driver must match the chosen
    subrequest itself."""
    node, _ = ready_node(kubelet_node, daemon, kube_client, NEURON, wait)
    docs = {d["kind"]: d for d in example(NEURON, "eight-or-four-connected-neurons.yaml")}
    template = json.loads(json.dumps(docs["ResourceClaimTemplate"]))
    devices = template["spec"]["spec"]["devices"]
    devices["requests"].append({"name": "one", "exactly": {"deviceClassName": NEURON.device_class}})
    devices["config"][0]["requests"] = ["neurons/eight"]
    create_in(kube_client, namespace, template)
    create_pod(kube_client, namespace, "two-requests", node.name,
               claims=[("neurons", "eight-or-four-connected-neurons")])
    running(kube_client, namespace, "two-requests", wait)
    claim = kube_client.get(ResourceClaim, pod_claim_name(kube_client, namespace, "two-requests") or "",
                            namespace=namespace).to_dict()
    chosen = {r["request"] for r in claim["status"]["allocation"]["devices"]["results"]}
    assert chosen == {"neurons/eight", "one"}, chosen
    assert [c["requests"] for c in claim["status"]["allocation"]["devices"]["config"]] == [["neurons/eight"]]
    (spec,) = [json.loads(p.read_text()) for p in claim_specs(node, NEURON)]
    env = {d["name"].rsplit("-request-", 1)[1]: dict(e.split("=", 1) for e in d["containerEdits"].get("env", []))
           for d in spec["devices"] if "-request-" in d["name"]}
    assert env["neurons"]["NEURON_LOGICAL_NC_CONFIG"] == "1" and env["neurons"]["NEURON_RT_VISIBLE_CORES"] == "0-63"
    assert "NEURON_LOGICAL_NC_CONFIG" not in env["one"] and env["one"]["NEURON_RT_VISIBLE_CORES"] == "0-3"


@pytest.mark.parametrize(("instance_type", "lnc_env", "cores"),
                         [("trn2.48xlarge", "1", "0-127"), ("trn1.32xlarge", None, "0-31")], ids=["trn2", "trn1"])
def test_trn2_else_trn1(kubelet_node: MakeNode, daemon: StartDaemon, kube_client: Client, classes: None,
                        namespace: str, wait: Wait, instance_type: str, lnc_env: str | None, cores: str) -> None:
    """examples/neuron-dra/trn2-else-trn1.yaml on one node of either type: 16 devices; LNC 1 only on trn2 (trn2:
    8 physical cores per device, so 128 at LNC 1; trn1: 2 cores per device and no LNC setting, 32)."""
    node = kubelet_node(instance_type)
    start_driver(daemon, node, NEURON)
    wait(lambda: published(kube_client, node.name, NEURON) == 16, "16 devices published", timeout=60)
    docs = {d["kind"]: d for d in example(NEURON, "trn2-else-trn1.yaml")}
    create_in(kube_client, namespace, docs["ResourceClaimTemplate"])
    create_pod(kube_client, namespace, "either", node.name, claims=[("neurons", "trn2-else-trn1")])
    running(kube_client, namespace, "either", wait)
    nodes, env = container_edits(node, "either", namespace)
    assert neuron_indices(nodes) == list(range(16))
    assert env.get("NEURON_LOGICAL_NC_CONFIG") == lnc_env and env["NEURON_RT_VISIBLE_CORES"] == cores, env


# -- 5. the unhealthy taint effect -----------------------------------------------------------------------------------
def one_device_template(name: str, kind: Kind) -> dict[str, Any]:
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate", "metadata": {"name": name},
            "spec": {"spec": {"devices": {"requests": [{"name": "one", "exactly": {
                "deviceClassName": kind.device_class}}]}}}}


@pytest.mark.parametrize("kind", [NEURON, EFA], ids=["neuron", "efa"])
def test_no_execute_taint_evicts_the_pod_of_a_device_that_turns_unhealthy(
        kubelet_node: MakeNode, daemon: StartDaemon, kube_client: Client, classes: None, namespace: str,
        wait: Wait, kind: Kind) -> None:
    node, _ = ready_node(kubelet_node, daemon, kube_client, kind, wait, "--unhealthy-taint-effect", "NoExecute",
                         "--noexecute-after", "5")
    create_in(kube_client, namespace, one_device_template("one", kind))
    for pod in ("victim", "bystander"):
        create_pod(kube_client, namespace, pod, node.name, claims=[("dev", "one")])
        running(kube_client, namespace, pod, wait)
    (victim,) = container_nodes(node, "victim", namespace, kind)
    if kind is NEURON:
        node.host.remove_dev_node(victim)  # the Neuron health rule: /dev node gone
    else:  # the EFA health rule: port not ACTIVE (read from the host's own ibdev file of that uverbs node)
        uverbs = victim.removeprefix("/dev/infiniband/")
        ibdev = (node.host.root / "sys/class/infiniband_verbs" / uverbs / "ibdev").read_text().strip()
        node.host.set_port_state(ibdev, "DOWN")

    def taints() -> list[dict[str, Any]]:
        return [t for sl in kube_client.list(ResourceSlice, fields={"spec.nodeName": node.name,
                                                                     "spec.driver": kind.driver})
                for dev in sl.to_dict()["spec"].get("devices", []) for t in dev.get("taints") or []]

    (published,) = wait(taints, "the unhealthy device tainted in its slice", timeout=60)
    assert (published["key"], published["effect"]) == (f"{kind.driver}/unhealthy", "NoSchedule"), \
        "NoSchedule at once; NoExecute only once the device stayed unhealthy --noexecute-after seconds"
    assert pod_phase(kube_client, namespace, "victim") == "Running", "no eviction during the hold"
    (upgraded,) = wait(lambda: [t for t in taints() if t["effect"] == "NoExecute"], "the NoExecute taint", timeout=60)
    assert upgraded["key"] == f"{kind.driver}/unhealthy"
    wait(lambda: pod_gone(kube_client, namespace, "victim"), "kube-controller-manager evicting the victim",
         timeout=120)
    assert pod_phase(kube_client, namespace, "bystander") == "Running", "a pod on a healthy device stays"


# -- 4. device status, written with the chart's RBAC -----------------------------------------------------------------
@pytest.fixture(scope="module")
def chart_rbac(control_plane: ControlPlane, kube_client: Client, classes: None) -> Iterator[None]:
    """Both charts' ServiceAccounts, ClusterRoles, bindings and admission policies (the classes exist already)."""
    with chart_objects(control_plane, kube_client, REPO_ROOT / CHARTS[NEURON][0],
                       ("--set", "draDriver.enabled=true", *CHARTS[NEURON][1])), \
            chart_objects(control_plane, kube_client, REPO_ROOT / CHARTS[EFA][0],
                          ("--set", "draDriver.enabled=true", *CHARTS[EFA][1])):
        yield


def device_status(client: Client, namespace: str, pod: str) -> list[dict[str, Any]]:
    name = pod_claim_name(client, namespace, pod)
    if name is None:
        return []
    claim = client.get(ResourceClaim, name, namespace=namespace).to_dict()
    return list(claim.get("status", {}).get("devices", []) or [])


@pytest.mark.parametrize("kind", [NEURON, EFA], ids=["neuron", "efa"])
def test_drivers_write_device_status_with_the_charts_rbac(control_plane: ControlPlane, kubelet_node: MakeNode,
                                                          daemon: StartDaemon, kube_client: Client, chart_rbac: None,
                                                          namespace: str, wait: Wait, kind: Kind) -> None:
    node = kubelet_node(kind.instance_type)
    support_kind = SUPPORT_NEURON if kind is NEURON else SUPPORT_EFA
    kubeconfig = pod_bound_kubeconfig(control_plane, kube_client, support_kind, node.name, wait)
    try:
        driver = daemon(kind.console, "serve", "--metrics-port", "0", "--healthcheck-port", "-1",
                        "--rescan-interval", "1", env=node.env(POD_UID=f"{kind.console}-pod",
                                                               KUBECONFIG=str(kubeconfig)))
        wait(lambda: published(kube_client, node.name, kind) == kind.devices, "devices published", timeout=60)
        wait(lambda: "kubelet registered the DRA plugin" in driver.tail(200), "the kubelet's registration",
             timeout=30)
        create_in(kube_client, namespace, all_devices_template("everything", kind))
        create_pod(kube_client, namespace, "user", node.name, claims=[("all", "everything")])
        running(kube_client, namespace, "user", wait)
        nodes = container_nodes(node, "user", namespace, kind)
        entries = wait(lambda: [e for e in device_status(kube_client, namespace, "user")
                                if e["driver"] == kind.driver] or None, "status.devices written", timeout=60)
        assert len(entries) == kind.devices and {e["pool"] for e in entries} == {node.name}
        for entry in entries:
            (ready,) = entry["conditions"]
            assert (ready["type"], ready["status"]) == ("Ready", "True")
        data = [e["data"] for e in entries]
        if kind is NEURON:
            assert {f"/dev/neuron{d['index']}" for d in data} == nodes
            assert all(d["logicalNeuronCore"] == 2 and d["pciBusID"].startswith("0000:") for d in data)
        else:
            assert {d["uverbs"] for d in data} == nodes
            assert all(d["rdmaDevice"].startswith("rdmap") for d in data) and "networkData" not in entries[0]
        assert "could not write the claim's device status" not in driver.tail(400)
    finally:
        with contextlib.suppress(ApiError):
            kube_client.delete(Pod, f"{support_kind.driver.split('.')[0]}-driver-{node.name}"[:63],
                               namespace=support_kind.namespace, grace_period=0)
