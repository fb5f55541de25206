"""The Neuron DRA driver end to end on the real control plane (kube-apiserver, kube-scheduler,
kube-controller-manager), with fake trn2.48xlarge and trn1.32xlarge nodes.

- The chart's DRA objects (namespace, ServiceAccount, ClusterRole/Binding, DeviceClass, admission policy) are
  rendered with helm and applied; the driver runs as ``neuron-dra-driver serve`` with a token bound to a Pod of
  its ServiceAccount on its node, so it has exactly the chart's RBAC and passes the chart's admission policy.
- The user's three ResourceClaimTemplates (seed 001) with Pods are allocated by kube-scheduler; the 4-device
  claim gets one whole torus row; preparing through the driver's DRA socket (kubelet stand-in) writes the right
  CDI specs; deleting the Pod (and so its claim) and unpreparing cleans up.
- On trn1, a 17-device claim stays unallocated.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import ssl
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from accel_rig.controlplane import ControlPlane
from accel_rig.kubelet_standin import KubeletStandIn
from lightkube import ApiError, Client, KubeConfig, codecs
from lightkube.models.resource_v1 import ResourceSliceSpec
from lightkube.resources.core_v1 import Node, NodeStatus, Pod
from lightkube.resources.resource_v1 import ResourceClaim, ResourceClaimTemplate, ResourceSlice
from neuron_listings import TRN2_48XLARGE_GUIDE

from accel_core.dra.checkpoint import CheckpointFile
from accel_core.dra.publisher import spec_key
from accel_core.fakehost import FakeHost, build_host
from accel_core.kubeletapi.constants import DRA_V1_SERVICE

Wait = Callable[..., Any]
FakeNode = Callable[..., str]

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "charts" / "neuron-helm-chart"
DRIVER = "neuron.aws.com"
DRA_NS = "neuron-dra-driver"
DRA_SA = "neuron-dra-driver-sa"
CHART_KINDS = ("Namespace", "ServiceAccount", "ClusterRole", "ClusterRoleBinding", "DeviceClass",
               "ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding")

# The user's ResourceClaimTemplates, exactly as in seed 001, from the examples users apply.
EXAMPLES = REPO / "examples" / "neuron-dra"
SEED_TEMPLATE_NAMES = ("all-neurons", "1x4-connected-neurons", "all-neurons-lnc-1")


def seed_templates() -> list[dict[str, Any]]:
    docs = [d for n in SEED_TEMPLATE_NAMES for d in yaml.safe_load_all((EXAMPLES / f"{n}.yaml").read_text())]
    return [d for d in docs if d["kind"] == "ResourceClaimTemplate"]



def _template(name: str, instance_type: str, count: int, group_attr: str | None) -> dict[str, Any]:
    request: dict[str, Any] = {"name": "neurons", "exactly": {
        "deviceClassName": DRIVER, "allocationMode": "ExactCount", "count": count,
        "selectors": [{"cel": {"expression": f"device.attributes['{DRIVER}'].instanceType == '{instance_type}'"}}]}}
    devices: dict[str, Any] = {"requests": [request]}
    if group_attr:
        devices["constraints"] = [{"requests": ["neurons"], "matchAttribute": group_attr}]
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate", "metadata": {"name": name},
            "spec": {"spec": {"devices": devices}}}


# -- fixtures -------------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def chart_objects(control_plane: ControlPlane, kube_client: Client) -> Iterator[None]:
    """The chart's DRA driver objects (not the DaemonSet: no kubelet would run it)."""
    out = subprocess.run(
        [str(control_plane.helm), "template", "neuron", str(CHART), "--set", "draDriver.enabled=true",
         "--set", "devicePlugin.enabled=false", "--set", "npd.enabled=false"],
        capture_output=True, text=True, timeout=120, check=False)
    assert out.returncode == 0, out.stderr
    docs = [d for d in yaml.safe_load_all(out.stdout) if d and d.get("kind") in CHART_KINDS]
    assert {d["kind"] for d in docs} == set(CHART_KINDS), "the chart no longer renders the DRA driver's objects"
    created = []
    for doc in docs:
        obj = codecs.from_dict(doc)
        try:
            kube_client.create(obj)
            created.append(obj)
        except ApiError as exc:
            if exc.status.code != 409:
                raise
    yield
    for obj in reversed(created):
        meta: Any = obj.metadata
        kind: Any = type(obj)
        with contextlib.suppress(ApiError):
            kube_client.delete(kind, meta.name, namespace=meta.namespace)


def pod_bound_kubeconfig(control_plane: ControlPlane, kube_client: Client, node: str, wait: Wait) -> Path:
    """A kubeconfig whose token is bound to a Pod of the driver's ServiceAccount on ``node`` (as the kubelet
    would give the DaemonSet pod), so it carries the node name the chart's admission policy checks."""
    pod_name = f"driver-{node}"
    kube_client.create(Pod.from_dict({  # type: ignore[call-overload]
        "metadata": {"name": pod_name, "namespace": DRA_NS},
        "spec": {"serviceAccountName": DRA_SA, "nodeName": node,
                 "containers": [{"name": "neuron-dra-driver", "image": "neuron-dra-driver:test"}]}}))
    wait(lambda: kube_client.get(Pod, pod_name, namespace=DRA_NS), "the driver pod")
    token = control_plane.mint_token(DRA_NS, DRA_SA, bound_pod=pod_name)
    return control_plane.kubeconfig_for_token(str(token), name=f"neuron-dra-{node}")


class Driver:
    """``neuron-dra-driver serve`` as a subprocess against a fake host."""

    def __init__(self, root: Path, node: str, kubeconfig: Path) -> None:
        self.root = root
        self.node = node
        self.host_root = root / "host"
        self.kubelet_root = root / "kubelet"
        self.cdi_root = root / "cdi"
        self.log = root / "driver.log"
        self.kubeconfig = kubeconfig
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        env = {**os.environ, "PYTHONPATH": str(REPO), "NODE_NAME": self.node, "POD_UID": "pod-uid-1"}
        env.pop("KUBECONFIG", None)
        with self.log.open("ab") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "neuron_dra.dra.cli", "serve", "--host-root", str(self.host_root),
                 "--kubelet-root", str(self.kubelet_root),
                 "--device-plugins-dir", str(self.kubelet_root / "device-plugins"), "--cdi-root", str(self.cdi_root),
                 "--kubeconfig", str(self.kubeconfig), "--metrics-port", "0", "--healthcheck-port", "-1",
                 "--rescan-interval", "1"],
                env=env, stdout=log, stderr=subprocess.STDOUT)

    def stop(self) -> int:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout=30)

    def tail(self) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-30:]) if self.log.exists() else ""

    def slices_cli(self) -> list[dict[str, Any]]:
        out = subprocess.run([sys.executable, "-m", "neuron_dra.dra.cli", "slices", "--host-root",
                              str(self.host_root), "--node-name", self.node, "--output", "json"],
                             env={**os.environ, "PYTHONPATH": str(REPO)}, capture_output=True, text=True,
                             timeout=60, check=True)
        data: list[dict[str, Any]] = json.loads(out.stdout)
        return data


@pytest.fixture
def start_driver(control_plane: ControlPlane, kube_client: Client, chart_objects: None, short_tmp: Path,
                 wait: Wait) -> Iterator[Callable[[str, str], Driver]]:
    drivers: list[Driver] = []

    def start(node: str, instance_type: str) -> Driver:
        root = short_tmp / node[-12:]
        build_host(root / "host", instance_type)
        driver = Driver(root, node, pod_bound_kubeconfig(control_plane, kube_client, node, wait))
        driver.start()
        drivers.append(driver)
        return driver

    yield start
    for driver in drivers:
        if driver.proc is not None and driver.proc.poll() is None:
            driver.proc.kill()
            driver.proc.wait(timeout=10)
        with contextlib.suppress(ApiError):
            kube_client.delete(Pod, f"driver-{driver.node}", namespace=DRA_NS, grace_period=0)


# -- helpers --------------------------------------------------------------------------------------------------------
def node_slices(kube_client: Client, node: str) -> list[dict[str, Any]]:
    return [s.to_dict() for s in kube_client.list(ResourceSlice, fields={"spec.nodeName": node, "spec.driver": DRIVER})]


def pod_node(kube_client: Client, namespace: str, pod: str) -> str | None:
    spec = kube_client.get(Pod, pod, namespace=namespace).spec
    return spec.nodeName if spec is not None else None


def make_pod(kube_client: Client, namespace: str, name: str, template: str) -> None:
    kube_client.create(Pod.from_dict({  # type: ignore[call-overload]
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"containers": [{"name": "app", "image": "public.ecr.aws/neuron/app:test",
                                 "resources": {"claims": [{"name": "neurons"}]}}],
                 "resourceClaims": [{"name": "neurons", "resourceClaimTemplateName": template}]}}))


def pod_claim(kube_client: Client, namespace: str, pod: str) -> dict[str, Any] | None:
    data = kube_client.get(Pod, pod, namespace=namespace).to_dict()
    statuses = data.get("status", {}).get("resourceClaimStatuses") or []
    name = statuses[0].get("resourceClaimName") if statuses else None
    if not name:
        return None
    claim: dict[str, Any] = kube_client.get(ResourceClaim, name, namespace=namespace).to_dict()
    return claim


def allocated_claim(kube_client: Client, namespace: str, pod: str, wait: Wait) -> dict[str, Any]:
    def check() -> dict[str, Any] | None:
        claim = pod_claim(kube_client, namespace, pod)
        return claim if claim and claim.get("status", {}).get("allocation") else None

    claim: dict[str, Any] = wait(check, f"an allocated claim for pod {namespace}/{pod}", timeout=90)
    return claim


def devices_of(claim: dict[str, Any], node: str) -> list[int]:
    results = claim["status"]["allocation"]["devices"]["results"]
    assert {(r["driver"], r["pool"]) for r in results} == {(DRIVER, node)}
    return sorted(int(r["device"].rsplit("-", 1)[1]) for r in results)


def delete_pod_and_claim(kube_client: Client, namespace: str, pod: str, claim: dict[str, Any], wait: Wait) -> None:
    kube_client.delete(Pod, pod, namespace=namespace, grace_period=0)
    name = claim["metadata"]["name"]

    def gone() -> bool:
        try:
            kube_client.get(ResourceClaim, name, namespace=namespace)
            return False
        except ApiError as exc:
            return exc.status.code == 404

    wait(gone, f"claim {namespace}/{name} deleted with its pod", timeout=90)


def prepare(kubelet: KubeletStandIn, *claims: dict[str, Any], unprepare: bool = False) -> dict[str, Any]:
    refs = [(c["metadata"]["namespace"], c["metadata"]["uid"], c["metadata"]["name"]) for c in claims]

    async def call() -> dict[str, Any]:
        conn = await kubelet.register_dra(DRIVER, timeout=30)
        try:
            assert conn.version == DRA_V1_SERVICE
            return await (conn.unprepare(*refs) if unprepare else conn.prepare(*refs))
        finally:
            await conn.close()

    return asyncio.run(call())


def cdi_spec(driver: Driver, claim: dict[str, Any]) -> dict[str, Any] | None:
    path = driver.cdi_root / f"k8s.neuron.aws.com-claim_{claim['metadata']['uid']}.json"
    if not path.exists():
        return None
    data: dict[str, Any] = json.loads(path.read_text())
    return data


def spec_contents(spec: dict[str, Any]) -> tuple[list[str], dict[str, str]]:
    nodes = [n["path"] for d in spec["devices"] for n in d["containerEdits"].get("deviceNodes", [])]
    env = dict(e.split("=", 1) for d in spec["devices"] for e in d["containerEdits"].get("env", []))
    return nodes, env


def wait_published(kube_client: Client, driver: Driver, count: int, wait: Wait) -> list[dict[str, Any]]:
    def check() -> list[dict[str, Any]] | None:
        if driver.proc is not None and driver.proc.poll() is not None:
            raise AssertionError(f"the driver exited with {driver.proc.returncode}:\n{driver.tail()}")
        found = node_slices(kube_client, driver.node)
        return found if sum(len(s["spec"].get("devices") or []) for s in found) == count else None

    try:
        slices: list[dict[str, Any]] = wait(check, f"{count} published devices for {driver.node}", timeout=90)
    except (AssertionError, TimeoutError) as exc:  # the driver exited, or the wait timed out
        raise AssertionError(f"{exc}\ndriver log:\n{driver.tail()}") from exc
    return slices


# -- tests ----------------------------------------------------------------------------------------------------------
@pytest.mark.timeout(900)
def test_trn2_seed_templates_allocate_prepare_and_clean_up(
    kube_client: Client, fake_node: FakeNode, start_driver: Callable[[str, str], Driver], namespace: str,
    wait: Wait,
) -> None:
    node = fake_node(labels={"node.kubernetes.io/instance-type": "trn2.48xlarge"})
    driver = start_driver(node, "trn2.48xlarge")
    [published] = wait_published(kube_client, driver, 16, wait)

    # what serve published: owned by the Node, pool = node, and exactly what `slices` prints
    node_uid = kube_client.get(Node, node).metadata.uid  # type: ignore[union-attr]
    assert published["metadata"]["ownerReferences"][0] == {
        "apiVersion": "v1", "kind": "Node", "name": node, "uid": node_uid, "controller": True}
    assert published["spec"]["pool"]["name"] == node and published["spec"]["pool"]["resourceSliceCount"] == 1
    [printed] = driver.slices_cli()
    assert spec_key(ResourceSliceSpec.from_dict(printed["spec"])) == spec_key(
        ResourceSliceSpec.from_dict(published["spec"]))
    dev5 = next(d for d in published["spec"]["devices"] if d["name"] == "neuron-device-5")
    assert dev5["attributes"]["topology_x"] == {"int": 1} and dev5["attributes"]["topology_y"] == {"int": 1}
    assert dev5["attributes"]["resource.aws.com/devicegroup1_id"] == {"string": "0000:57:00.0"}

    # the driver's credentials carry only the chart's rights: no other node's slices, no pods
    limited = Client(KubeConfig.from_file(driver.kubeconfig), field_manager="e2e-probe")
    foreign = {**printed, "spec": {**printed["spec"], "nodeName": "some-other-node",
                                   "pool": {**printed["spec"]["pool"], "name": "some-other-node"}}}

    def refused() -> str | None:
        """The policy takes effect once the API server has loaded it; until then RBAC alone lets this through."""
        try:
            created: Any = limited.create(ResourceSlice.from_dict(foreign))  # type: ignore[call-overload]
        except ApiError as exc:
            return exc.status.message if exc.status.code in (403, 422) else None
        kube_client.delete(ResourceSlice, created.metadata.name)
        return None

    message = wait(refused, "the chart's admission policy to refuse a slice of another node")
    assert "may only write ResourceSlices of its own node" in message
    with pytest.raises(ApiError) as forbidden:
        list(limited.list(Pod, namespace=namespace))
    assert forbidden.value.status.code == 403
    limited.close()

    for doc in seed_templates():
        kube_client.create(ResourceClaimTemplate.from_dict(doc), namespace=namespace)  # type: ignore[call-overload]
    kubelet = KubeletStandIn(driver.kubelet_root)

    # 1. four connected devices: one whole torus row
    make_pod(kube_client, namespace, "row", "1x4-connected-neurons")
    row_claim = allocated_claim(kube_client, namespace, "row", wait)
    row = devices_of(row_claim, node)
    assert len(row) == 4 and len({i // 4 for i in row}) == 1, f"not one torus row: {row}"
    wait(lambda: pod_node(kube_client, namespace, "row") == node, "pod row bound")
    resp = prepare(kubelet, row_claim)
    entry = resp[row_claim["metadata"]["uid"]]
    assert entry.error == "", entry.error
    assert sorted(d.device_name for d in entry.devices) == sorted(f"neuron-device-{i}" for i in row)
    spec = cdi_spec(driver, row_claim)
    assert spec is not None
    nodes, env = spec_contents(spec)
    assert nodes == [f"/dev/neuron{i}" for i in row]
    assert env == {"NEURON_RT_VISIBLE_CORES": "0-15"}  # container numbering: its 4 devices x 4 cores
    # delete: the claim goes with its pod, and unprepare (the claim already gone) cleans up
    delete_pod_and_claim(kube_client, namespace, "row", row_claim, wait)
    resp = prepare(kubelet, row_claim, unprepare=True)
    assert resp[row_claim["metadata"]["uid"]].error == ""
    assert cdi_spec(driver, row_claim) is None

    # 2. all devices, then 3. all devices with LNC 1
    for pod, template, cores, lnc in (("all", "all-neurons", "0-63", None),
                                      ("lnc1", "all-neurons-lnc-1", "0-127", "1")):
        make_pod(kube_client, namespace, pod, template)
        claim = allocated_claim(kube_client, namespace, pod, wait)
        assert devices_of(claim, node) == list(range(16))
        wait(lambda p=pod: pod_node(kube_client, namespace, p) == node, f"pod {pod} bound")
        entry = prepare(kubelet, claim)[claim["metadata"]["uid"]]
        assert entry.error == "", entry.error
        spec = cdi_spec(driver, claim)
        assert spec is not None
        nodes, env = spec_contents(spec)
        assert nodes == [f"/dev/neuron{i}" for i in range(16)]
        expected = {"NEURON_RT_VISIBLE_CORES": cores, **({"NEURON_LOGICAL_NC_CONFIG": lnc} if lnc else {})}
        assert env == expected
        delete_pod_and_claim(kube_client, namespace, pod, claim, wait)
        assert prepare(kubelet, claim, unprepare=True)[claim["metadata"]["uid"]].error == ""
        assert cdi_spec(driver, claim) is None

    checkpoint = CheckpointFile(driver.kubelet_root / "plugins" / DRIVER / "checkpoint.json")
    assert checkpoint.load().claims == {}, "a restarted driver finds no entry"
    assert driver.stop() == 0, driver.tail()


@pytest.mark.timeout(900)
def test_trn1_row_allocation_and_a_17_device_claim_stays_unallocated(
    kube_client: Client, fake_node: FakeNode, start_driver: Callable[[str, str], Driver], namespace: str,
    wait: Wait,
) -> None:
    node = fake_node(labels={"node.kubernetes.io/instance-type": "trn1.32xlarge"})
    driver = start_driver(node, "trn1.32xlarge")
    [published] = wait_published(kube_client, driver, 16, wait)
    groups = {d["name"]: d["attributes"]["resource.aws.com/devicegroup1_id"]["string"]
              for d in published["spec"]["devices"]}
    assert groups["neuron-device-0"] == groups["neuron-device-1"] == "0000:10:1a.0"  # two devices per EFA on trn1

    kube_client.create(ResourceClaimTemplate.from_dict(  # type: ignore[call-overload]
        _template("trn1-row", "trn1.32xlarge", 4, "resource.aws.com/devicegroup4_id")), namespace=namespace)
    kube_client.create(ResourceClaimTemplate.from_dict(  # type: ignore[call-overload]
        _template("trn1-17", "trn1.32xlarge", 17, None)), namespace=namespace)

    make_pod(kube_client, namespace, "too-big", "trn1-17")

    def unschedulable() -> bool:
        conditions = kube_client.get(Pod, "too-big", namespace=namespace).to_dict().get("status", {}).get(
            "conditions") or []
        return any(c["type"] == "PodScheduled" and c["status"] == "False" and c.get("reason") == "Unschedulable"
                   for c in conditions)

    wait(unschedulable, "the scheduler to give up on the 17-device claim", timeout=90)
    claim = pod_claim(kube_client, namespace, "too-big")
    assert claim is not None and not claim.get("status", {}).get("allocation")
    assert not pod_node(kube_client, namespace, "too-big")

    # device 1 vanishes: it stays in the slice with a NoSchedule taint, so no claim gets torus row 0
    host = FakeHost.attach(driver.host_root)
    host.remove_neuron(1)

    def tainted() -> bool:
        [current] = node_slices(kube_client, node)
        dev1 = next(d for d in current["spec"]["devices"] if d["name"] == "neuron-device-1")
        return [(t["key"], t.get("value"), t["effect"]) for t in dev1.get("taints") or []] == [
            ("neuron.aws.com/unhealthy", "DeviceMissing", "NoSchedule")]

    wait(tainted, "device 1 tainted in the published slice", timeout=60)

    make_pod(kube_client, namespace, "row", "trn1-row")
    row_claim = allocated_claim(kube_client, namespace, "row", wait)
    row = devices_of(row_claim, node)
    assert len(row) == 4 and len({i // 4 for i in row}) == 1, f"not one torus row: {row}"
    assert row[0] >= 4, f"the row with the tainted device was allocated: {row}"
    kubelet = KubeletStandIn(driver.kubelet_root)
    entry = prepare(kubelet, row_claim)[row_claim["metadata"]["uid"]]
    assert entry.error == "", entry.error
    spec = cdi_spec(driver, row_claim)
    assert spec is not None
    nodes, env = spec_contents(spec)
    assert nodes == [f"/dev/neuron{i}" for i in row]
    assert env == {"NEURON_RT_VISIBLE_CORES": "0-7"}  # trn1: 2 cores per device, container numbering
    assert driver.stop() == 0, driver.tail()
    # uninstall: the driver's own credentials remove its slices, and only those
    assert node_slices(kube_client, node), "stopping (an upgrade) keeps the slices"
    out = subprocess.run([sys.executable, "-m", "neuron_dra.dra.cli", "remove-slices", "--node-name", node,
                          "--kubeconfig", str(driver.kubeconfig)], env={**os.environ, "PYTHONPATH": str(REPO)},
                         capture_output=True, text=True, timeout=60, check=False)
    assert out.returncode == 0, out.stderr
    assert "removed 1 ResourceSlice" in out.stdout
    assert node_slices(kube_client, node) == []


@pytest.mark.timeout(600)
def test_trn2_numa_node_and_node_label_attributes_follow_the_node(
    kube_client: Client, fake_node: FakeNode, start_driver: Callable[[str, str], Driver], namespace: str,
    wait: Wait,
) -> None:
    """AWS attribute parity: ``resource.kubernetes.io/numaNode`` as neuron-ls prints it, usable by the real
    scheduler; the Node's topology labels reach every device within seconds, and leave with the label."""
    layer1, capacity_block = "topology.k8s.aws/network-node-layer-1", "topology.k8s.aws/capacity-block-id"
    node = fake_node(labels={"node.kubernetes.io/instance-type": "trn2.48xlarge", capacity_block: "cr-0123abcd"})
    driver = start_driver(node, "trn2.48xlarge")
    [published] = wait_published(kube_client, driver, 16, wait)
    for dev in published["spec"]["devices"]:
        index = int(dev["name"].rsplit("-", 1)[1])
        assert dev["attributes"]["resource.kubernetes.io/numaNode"] == {"int": TRN2_48XLARGE_GUIDE[index][2]}
        assert dev["attributes"]["capacityBlockId"] == {"string": "cr-0123abcd"}, "the first write carries it"
        assert "networkNodeLayer1" not in dev["attributes"]

    def layer1_values() -> set[str | None]:
        [current] = node_slices(kube_client, node)
        return {(d["attributes"].get("networkNodeLayer1") or {}).get("string") for d in current["spec"]["devices"]}

    started = time.monotonic()
    kube_client.patch(Node, node, {"metadata": {"labels": {layer1: "nn-abc"}}})
    wait(lambda: layer1_values() == {"nn-abc"}, "networkNodeLayer1 on every device", timeout=30)
    assert time.monotonic() - started < 10, "the label took more than 10 s to reach the slice"

    # an unrelated label (or any other Node change) costs no slice write
    [before] = node_slices(kube_client, node)
    kube_client.patch(Node, node, {"metadata": {"labels": {"example.com/unrelated": "x"}}})
    time.sleep(2)
    [after] = node_slices(kube_client, node)
    assert after["metadata"]["resourceVersion"] == before["metadata"]["resourceVersion"]

    # the real scheduler reads numaNode: 8 devices on NUMA 0 are devices 4-11 (neuron-ls guide)
    numa0 = sorted(i for i, row in TRN2_48XLARGE_GUIDE.items() if row[2] == 0)
    kube_client.create(ResourceClaimTemplate.from_dict({  # type: ignore[call-overload]
        "metadata": {"name": "numa0"},
        "spec": {"spec": {"devices": {"requests": [{"name": "neurons", "exactly": {
            "deviceClassName": "neuron.aws.com", "allocationMode": "ExactCount", "count": 8,
            "selectors": [{"cel": {"expression":
                                   "device.attributes['resource.kubernetes.io'].numaNode == 0 && "
                                   "device.attributes['neuron.aws.com'].networkNodeLayer1 == 'nn-abc'"}}]}}]}}}}),
        namespace=namespace)
    make_pod(kube_client, namespace, "numa0", "numa0")
    claim = allocated_claim(kube_client, namespace, "numa0", wait)
    assert devices_of(claim, node) == numa0
    delete_pod_and_claim(kube_client, namespace, "numa0", claim, wait)

    started = time.monotonic()
    kube_client.patch(Node, node, {"metadata": {"labels": {layer1: None}}})
    wait(lambda: layer1_values() == {None}, "networkNodeLayer1 gone from every device", timeout=30)
    assert time.monotonic() - started < 10, "the removed label took more than 10 s to leave the slice"
    [final] = node_slices(kube_client, node)
    assert all(d["attributes"]["capacityBlockId"] == {"string": "cr-0123abcd"} for d in final["spec"]["devices"])
    started = time.monotonic()
    assert driver.stop() == 0, driver.tail()
    assert time.monotonic() - started < 4, "the Node watch held up the driver's exit"


def _node_gets(control_plane: ControlPlane) -> float:
    """GETs of single Nodes the API server has answered so far (its ``apiserver_request_total``)."""
    cert, key = control_plane.pki.client("admin")
    ctx = ssl.create_default_context(cafile=str(control_plane.ca_cert))
    ctx.load_cert_chain(str(cert), str(key))
    text = urllib.request.urlopen(f"{control_plane.server}/metrics", context=ctx, timeout=30).read().decode()
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith("apiserver_request_total{") and 'resource="nodes"' in line
               and 'verb="GET"' in line and 'scope="resource"' in line and 'subresource=""' in line)


def test_beside_a_device_plugin_the_driver_waits_on_its_node_watch_not_by_polling(
    control_plane: ControlPlane, kube_client: Client, fake_node: FakeNode, start_driver: Callable[[str, str], Driver],
    wait: Wait,
) -> None:
    """While the Node's allocatable still offers the device plugin's ``aws.amazon.com/neuron``, the driver publishes
    nothing; it follows the Node through the one watch its label attributes already need, and so do the slices'
    owner reference and the UltraServer labels it owns (removed here: a trn2 outside an UltraServer). The whole start
    is one GET of the Node however long the wait, and it publishes within seconds of the kubelet's status update."""
    node = fake_node(labels={"node.kubernetes.io/instance-type": "trn2.48xlarge"})
    offered = {"cpu": "8", "memory": "32Gi", "pods": "110", "aws.amazon.com/neuron": "16"}
    kube_client.patch(NodeStatus, node, {"status": {"capacity": offered, "allocatable": offered}})
    before = _node_gets(control_plane)
    driver = start_driver(node, "trn2.48xlarge")
    wait(lambda: "waiting to publish" in driver.tail() or None, "the driver waiting for the device plugin", timeout=60)
    time.sleep(4)  # eight polls of a GET loop
    assert node_slices(kube_client, node) == [], "published beside the device plugin's allocatable resources"
    drained = {**offered, "aws.amazon.com/neuron": "0"}
    kube_client.patch(NodeStatus, node, {"status": {"capacity": drained, "allocatable": drained}})
    started = time.monotonic()
    wait_published(kube_client, driver, 16, wait)
    assert time.monotonic() - started < 10, "the status update took more than 10 s to reach the driver"
    assert _node_gets(control_plane) - before == 1, driver.tail()
    [published] = node_slices(kube_client, node)
    [owner] = published["metadata"]["ownerReferences"]
    assert (owner["kind"], owner["uid"]) == ("Node", kube_client.get(Node, node).metadata.uid)
