"""The EFA DRA driver end to end on the real control plane (kube-apiserver, kube-scheduler,
kube-controller-manager), next to the Neuron DRA driver, on fake trn2.48xlarge, trn1.32xlarge and p5.48xlarge nodes.

- Both charts' DRA objects are rendered with helm and applied; each driver runs as its console script with a token
  bound to a Pod of its ServiceAccount on its node (so exactly the chart's RBAC and admission policy apply).
- kube-scheduler allocates the examples/efa-dra claims; the EFA devices it picks next to Neuron devices are checked
  against the AWS Neuron-to-EFA tables as neuron.md writes them down (not against our code's tables).
- Claims are prepared through each driver's DRA socket (kubelet stand-in): idempotent, and after kill -9 the driver
  comes back with the same answer from its checkpoint.
- The drivers' credentials get only the verbs the code uses; the API server refuses the rest. A driver may write
  status.devices for its own driver on claims allocated on its node (granular status authorization), nothing else.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from accel_rig.controlplane import ControlPlane
from accel_rig.kubelet_standin import KubeletStandIn
from dra_support import (
    EFA,
    NEURON,
    REPO,
    DriverKind,
    DriverProcess,
    allocated_claim,
    call_driver,
    chart_objects,
    delete_and_wait,
    make_pod,
    node_slices,
    pod_bound_kubeconfig,
    pod_node,
    results,
    spec_nodes,
    wait_published,
)
from lightkube import ApiError, Client, KubeConfig, codecs
from lightkube.resources.core_v1 import Node, Pod
from lightkube.resources.resource_v1 import ResourceClaim, ResourceClaimTemplate, ResourceSlice
from lightkube.types import PatchType

from accel_core.fakehost import FakeHost, build_host

Wait = Callable[..., Any]
FakeNode = Callable[..., str]
EXAMPLES = REPO / "examples" / "efa-dra"
EFA_CHART_FLAGS = ("--set", "devicePlugin.enabled=false", "--set", "draDriver.enabled=true")
NEURON_CHART_FLAGS = ("--set", "devicePlugin.enabled=false", "--set", "npd.enabled=false",
                      "--set", "draDriver.enabled=true")

# neuron.md section 3 (AWS Neuron-to-EFA tables), written down here, not taken from our code:
# trn2: Neuron device i -> EFA 0000:<TRN2_BUS[i]>:00.0
TRN2_BUS = ["c9", "b4", "b3", "ca", "6c", "57", "56", "6d", "98", "83", "82", "99", "f5", "e0", "df", "f6"]
# trn1: two Neuron devices per EFA
TRN1_EFA = ["10:1a.0", "10:1a.0", "a0:1a.0", "a0:1a.0", "20:19.0", "20:19.0", "90:19.0", "90:19.0",
            "20:1a.0", "20:1a.0", "90:1a.0", "90:1a.0", "10:19.0", "10:19.0", "a0:19.0", "a0:19.0"]
# efa.md section 2.2, p5.48xlarge: 32 EFAs in 8 groups of 4 consecutive buses, one group per GPU's PCIe root
P5_ROOT_GROUPS = [{f"rdmap{n}s0" for n in range(first, first + 4)}
                  for first in (79, 96, 113, 130, 147, 164, 181, 198)]


def efa_name(bdf: str) -> str:
    return "efa-" + bdf.replace(":", "-").replace(".", "-")


def index_of(neuron_device: str) -> int:
    return int(neuron_device.rsplit("-", 1)[1])


def examples(name: str) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all((EXAMPLES / name).read_text()) if d]


def create(client: Client, doc: dict[str, Any], namespace: str) -> None:
    client.create(codecs.from_dict(doc), namespace=namespace)  # type: ignore[call-overload]


# -- fixtures -------------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def charts(control_plane: ControlPlane, kube_client: Client) -> Iterator[None]:
    with chart_objects(control_plane, kube_client, REPO / "charts" / "aws-efa-k8s-device-plugin", EFA_CHART_FLAGS), \
            chart_objects(control_plane, kube_client, REPO / "charts" / "neuron-helm-chart", NEURON_CHART_FLAGS):
        yield


@pytest.fixture
def start(control_plane: ControlPlane, kube_client: Client, charts: None, short_tmp: Path,
          wait: Wait) -> Iterator[Callable[[DriverKind, str, str], DriverProcess]]:
    drivers: list[DriverProcess] = []

    def start(kind: DriverKind, node: str, instance_type: str) -> DriverProcess:
        root = short_tmp / node[-12:]
        if not (root / "host").exists():
            build_host(root / "host", instance_type)
        driver = DriverProcess(kind, root, node, pod_bound_kubeconfig(control_plane, kube_client, kind, node, wait))
        driver.start()
        drivers.append(driver)
        return driver

    yield start
    for driver in drivers:
        if driver.running():
            assert driver.proc is not None
            driver.proc.kill()
            driver.proc.wait(timeout=10)
        with contextlib.suppress(ApiError):
            kube_client.delete(Pod, f"{driver.kind.driver.split('.')[0]}-driver-{driver.node}"[:63],
                               namespace=driver.kind.namespace, grace_period=0)


def both_drivers(start: Callable[[DriverKind, str, str], DriverProcess], kube_client: Client, node: str,
                 instance_type: str, efa_count: int, wait: Wait) -> tuple[DriverProcess, DriverProcess]:
    efa = start(EFA, node, instance_type)
    neuron = start(NEURON, node, instance_type)
    wait_published(kube_client, efa, efa_count, wait)
    wait_published(kube_client, neuron, 16, wait)
    return efa, neuron


# -- Neuron devices with their EFAs ---------------------------------------------------------------------------------
@pytest.mark.timeout(900)
def test_trn2_four_connected_neuron_devices_get_exactly_their_efas(
    kube_client: Client, fake_node: FakeNode, start: Callable[[DriverKind, str, str], DriverProcess],
    namespace: str, wait: Wait,
) -> None:
    # a node with EC2's network topology label: both drivers' devices carry it, the seed's templates allocate as before
    node = fake_node(labels={"node.kubernetes.io/instance-type": "trn2.48xlarge",
                             "topology.k8s.aws/network-node-layer-3": "nn-e2e-3"})
    efa, neuron = both_drivers(start, kube_client, node, "trn2.48xlarge", 16, wait)
    for driver in (efa, neuron):
        devices = [d for s in node_slices(kube_client, node, driver.kind.driver) for d in s["spec"]["devices"]]
        assert len(devices) == 16 and all(d["attributes"]["networkNodeLayer3"] == {"string": "nn-e2e-3"}
                                          and "resource.kubernetes.io/numaNode" in d["attributes"] for d in devices)
    for name in ("trn2-4-neurons-with-their-efa.yaml", "1-neuron-with-its-efa.yaml"):
        create(kube_client, next(d for d in examples(name) if d["kind"] == "ResourceClaimTemplate"), namespace)
    kubelet = KubeletStandIn(efa.kubelet_root)

    # (c): one torus row and the four EFAs the table wires to it
    make_pod(kube_client, namespace, "row", template="trn2-4-neurons-with-their-efa")
    claim = allocated_claim(kube_client, namespace, wait, pod="row")
    row = sorted(index_of(n) for n in results(claim, NEURON.driver))
    assert len(row) == 4 and len({i // 4 for i in row}) == 1, f"not one torus row: {row}"
    assert results(claim, EFA.driver) == sorted(efa_name(f"0000:{TRN2_BUS[i]}:00.0") for i in row)
    wait(lambda: pod_node(kube_client, namespace, "row") == node, "pod row bound")

    uid = claim["metadata"]["uid"]
    for driver in (efa, neuron):
        entry = call_driver(kubelet, driver.kind.driver, claim)[uid]
        assert entry.error == "", entry.error
    efa_spec = efa.cdi_spec(uid)
    assert efa_spec is not None and efa_spec["kind"] == "k8s.efa.aws.com/claim"
    nodes = spec_nodes(efa_spec)
    assert nodes.pop(f"{uid}-request-efa") == ["/dev/infiniband/rdma_cm"]
    assert sorted(nodes) == sorted(f"{uid}-{name}" for name in results(claim, EFA.driver))
    host = FakeHost.attach(efa.host_root)
    published = {d["name"]: d for s in node_slices(kube_client, node, EFA.driver) for d in s["spec"]["devices"]}
    for name in results(claim, EFA.driver):
        ibdev = published[name]["attributes"]["rdmaDevice"]["string"]
        assert nodes[f"{uid}-{name}"] == [f"/dev/infiniband/{host.uverbs_of(ibdev)}"]
    neuron_spec = neuron.cdi_spec(uid)
    assert neuron_spec is not None
    assert sorted(p for ps in spec_nodes(neuron_spec).values() for p in ps) == sorted(f"/dev/neuron{i}" for i in row)

    # (d): one Neuron device and its EFA
    make_pod(kube_client, namespace, "one", template="1-neuron-with-its-efa")
    one = allocated_claim(kube_client, namespace, wait, pod="one")
    [device] = results(one, NEURON.driver)
    assert results(one, EFA.driver) == [efa_name(f"0000:{TRN2_BUS[index_of(device)]}:00.0")]
    assert index_of(device) not in row

    delete_and_wait(kube_client, namespace, ["row"], claim, wait)
    for driver in (efa, neuron):
        assert call_driver(kubelet, driver.kind.driver, claim, unprepare=True)[uid].error == ""
        assert driver.cdi_spec(uid) is None and driver.checkpoint_claims() == {}
    assert efa.stop() == 0, efa.tail()
    assert neuron.stop() == 0, neuron.tail()


@pytest.mark.timeout(900)
def test_trn1_eight_neuron_devices_get_their_four_efas(
    kube_client: Client, fake_node: FakeNode, start: Callable[[DriverKind, str, str], DriverProcess],
    namespace: str, wait: Wait,
) -> None:
    node = fake_node(labels={"node.kubernetes.io/instance-type": "trn1.32xlarge"})
    efa, neuron = both_drivers(start, kube_client, node, "trn1.32xlarge", 8, wait)
    [template] = [d for d in examples("trn2-4-neurons-with-their-efa.yaml") if d["kind"] == "ResourceClaimTemplate"]
    devices = template["spec"]["spec"]["devices"]
    devices["requests"][0]["exactly"]["count"] = 8
    devices["requests"][0]["exactly"]["selectors"][0]["cel"]["expression"] = \
        "device.attributes['neuron.aws.com'].instanceType == 'trn1.32xlarge'"
    devices["requests"][1]["exactly"]["count"] = 4  # trn1: one EFA per two Neuron devices
    devices["constraints"][0]["matchAttribute"] = "resource.aws.com/devicegroup8_id"
    template["metadata"]["name"] = "trn1-8-neurons-with-their-efa"
    create(kube_client, template, namespace)

    make_pod(kube_client, namespace, "half", template="trn1-8-neurons-with-their-efa")
    claim = allocated_claim(kube_client, namespace, wait, pod="half")
    half = sorted(index_of(n) for n in results(claim, NEURON.driver))
    assert half in (list(range(8)), list(range(8, 16))), half
    expected = sorted({efa_name(f"0000:{TRN1_EFA[i]}") for i in half})
    assert len(expected) == 4 and results(claim, EFA.driver) == expected
    wait(lambda: pod_node(kube_client, namespace, "half") == node, "pod half bound")
    kubelet = KubeletStandIn(efa.kubelet_root)
    for driver in (efa, neuron):
        assert call_driver(kubelet, driver.kind.driver, claim)[claim["metadata"]["uid"]].error == ""
    assert efa.stop() == 0, efa.tail()
    assert neuron.stop() == 0, neuron.tail()


# -- p5: one PCIe root, all EFAs shared, restarts -------------------------------------------------------------------
def rdma_devices(kube_client: Client, node: str, names: list[str]) -> set[str]:
    published = {d["name"]: d for s in node_slices(kube_client, node, EFA.driver) for d in s["spec"]["devices"]}
    return {published[n]["attributes"]["rdmaDevice"]["string"] for n in names}


@pytest.mark.timeout(900)
def test_p5_one_pcie_root_all_efa_shared_and_kill9_recovery(
    kube_client: Client, fake_node: FakeNode, start: Callable[[DriverKind, str, str], DriverProcess],
    namespace: str, wait: Wait,
) -> None:
    node = fake_node(labels={"node.kubernetes.io/instance-type": "p5.48xlarge"})
    efa = start(EFA, node, "p5.48xlarge")
    [published] = wait_published(kube_client, efa, 32, wait)
    node_uid = kube_client.get(Node, node).metadata.uid  # type: ignore[union-attr]
    assert published["metadata"]["ownerReferences"][0]["uid"] == node_uid
    kubelet = KubeletStandIn(efa.kubelet_root)
    template, _ = examples("p5-4-efa-one-pcie-root.yaml")
    create(kube_client, template, namespace)

    # (a): four EFAs, one whole PCIe root
    make_pod(kube_client, namespace, "root", template="p5-4-efa-one-pcie-root")
    claim = allocated_claim(kube_client, namespace, wait, pod="root")
    got = rdma_devices(kube_client, node, results(claim, EFA.driver))
    assert got in P5_ROOT_GROUPS, f"not one PCIe root: {sorted(got)}"
    wait(lambda: pod_node(kube_client, namespace, "root") == node, "pod root bound")
    uid = claim["metadata"]["uid"]
    first = call_driver(kubelet, EFA.driver, claim)[uid]
    assert first.error == "", first.error
    again = call_driver(kubelet, EFA.driver, claim)[uid]
    assert [list(d.cdi_device_ids) for d in again.devices] == [list(d.cdi_device_ids) for d in first.devices]
    spec_before = efa.cdi_spec(uid)

    # kill -9; the CDI spec is lost too (the node's /var/run); the driver comes back with the same answer
    efa.kill9()
    (efa.cdi_root / f"k8s.efa.aws.com-claim_{uid}.json").unlink()
    efa.start()
    wait(lambda: efa.cdi_spec(uid), "the CDI spec re-created from the checkpoint", timeout=60)
    assert efa.cdi_spec(uid) == spec_before
    after = call_driver(kubelet, EFA.driver, claim)[uid]
    assert [list(d.cdi_device_ids) for d in after.devices] == [list(d.cdi_device_ids) for d in first.devices]
    assert list(efa.checkpoint_claims()) == [uid]
    [same] = wait_published(kube_client, efa, 32, wait)
    assert same["metadata"]["name"] == published["metadata"]["name"], "the slice survives the restart"

    # a port goes down: the device is tainted, and a new (a) claim avoids its root
    host = FakeHost.attach(efa.host_root)
    free = next(g for g in P5_ROOT_GROUPS if g != got)
    down = sorted(free)[0]
    host.set_port_state(down, "DOWN")

    def tainted() -> bool:
        [current] = node_slices(kube_client, node, EFA.driver)
        dev = next(d for d in current["spec"]["devices"] if d["attributes"]["rdmaDevice"]["string"] == down)
        return [(t["key"], t.get("value"), t["effect"]) for t in dev.get("taints") or []] == [
            ("efa.aws.com/unhealthy", "PortDown", "NoSchedule")]

    wait(tainted, f"{down} tainted PortDown", timeout=60)
    make_pod(kube_client, namespace, "root2", template="p5-4-efa-one-pcie-root")
    second = allocated_claim(kube_client, namespace, wait, pod="root2")
    got2 = rdma_devices(kube_client, node, results(second, EFA.driver))
    assert got2 in P5_ROOT_GROUPS and got2 not in (got, free), sorted(got2)

    # unprepare is idempotent; then (b): every EFA in one claim, shared by two pods
    delete_and_wait(kube_client, namespace, ["root"], claim, wait)
    second_claim = allocated_claim(kube_client, namespace, wait, pod="root2")
    delete_and_wait(kube_client, namespace, ["root2"], second_claim, wait)
    for _ in range(2):
        assert call_driver(kubelet, EFA.driver, claim, unprepare=True)[uid].error == ""
    host.set_port_state(down, "ACTIVE")
    wait(lambda: not tainted() and all(not d.get("taints") for s in node_slices(kube_client, node, EFA.driver)
                                       for d in s["spec"]["devices"]), "no taints left", timeout=60)
    shared_claim, pod1, pod2 = examples("all-efa-shared.yaml")
    create(kube_client, shared_claim, namespace)
    for pod in (pod1, pod2):
        pod["spec"]["nodeSelector"] = {"kubernetes.io/hostname": node}
        create(kube_client, pod, namespace)
    shared = allocated_claim(kube_client, namespace, wait, name="all-efa")
    assert len(results(shared, EFA.driver)) == 32
    for pod in ("all-efa-workload-1", "all-efa-workload-2"):
        wait(lambda p=pod: pod_node(kube_client, namespace, p) == node, f"pod {pod} bound")
    reserved = wait(lambda: len(kube_client.get(ResourceClaim, "all-efa", namespace=namespace).to_dict()
                                ["status"].get("reservedFor") or []) == 2, "both pods reserve the claim")
    assert reserved
    shared = kube_client.get(ResourceClaim, "all-efa", namespace=namespace).to_dict()
    entry = call_driver(kubelet, EFA.driver, shared)[shared["metadata"]["uid"]]
    assert entry.error == "" and len(entry.devices) == 32
    spec = efa.cdi_spec(shared["metadata"]["uid"])
    assert spec is not None and len(spec["devices"]) == 33  # 32 uverbs + the request's rdma_cm
    assert efa.stop() == 0, efa.tail()


# -- least privilege ------------------------------------------------------------------------------------------------
def http_status(exc: BaseException) -> int | None:
    if isinstance(exc, ApiError):
        return int(exc.status.code or 0)
    response = getattr(exc, "response", None)  # lightkube's watch raises the HTTP client's status error
    return int(response.status_code) if response is not None else None


@pytest.mark.parametrize("kind", [EFA, NEURON], ids=["efa", "neuron"])
def test_driver_credentials_allow_only_what_the_code_uses(
    control_plane: ControlPlane, kube_client: Client, charts: None, fake_node: FakeNode, namespace: str,
    kind: DriverKind, wait: Wait, short_tmp: Path,
) -> None:
    node = fake_node()
    kubeconfig = pod_bound_kubeconfig(control_plane, kube_client, kind, node, wait)
    request = {"name": "r", "exactly": {"deviceClassName": "efa.networking.k8s.aws"}}
    claim = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": {"name": "c"},
             "spec": {"devices": {"requests": [request]}}}
    create(kube_client, claim, namespace)
    mine = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice", "metadata": {"generateName": f"{node}-x-"},
            "spec": {"driver": kind.driver, "nodeName": node, "pool": {"name": node, "generation": 1,
                                                                       "resourceSliceCount": 1},
                     "devices": [{"name": "d0"}]}}
    limited = Client(KubeConfig.from_file(kubeconfig), field_manager="rbac-probe")
    try:
        # what the driver does: GET its claim, GET and watch its Node; list, watch, create, update, delete its slices
        assert limited.get(ResourceClaim, "c", namespace=namespace).metadata.name == "c"  # type: ignore[union-attr]
        assert limited.get(Node, node).metadata.name == node  # type: ignore[union-attr]
        _, seen = next(iter(limited.watch(Node, fields={"metadata.name": node}, resource_version="0")))  # its labels
        assert seen.metadata.name == node  # type: ignore[union-attr]
        made = limited.create(codecs.from_dict(mine))  # type: ignore[call-overload]
        name = made.metadata.name
        assert [s.metadata.name for s in limited.list(ResourceSlice, fields={"spec.nodeName": node})] == [name]
        next(iter(limited.watch(ResourceSlice, fields={"spec.nodeName": node}, resource_version="0")))
        made.spec.pool.generation = 2
        limited.replace(made)
        limited.delete(ResourceSlice, name)
        # issue 25 item 9: the admission policy keeps the node's token to its own node's pool
        elsewhere = {**mine, "spec": {**mine["spec"], "pool": {"name": "another-node", "generation": 1,
                                                               "resourceSliceCount": 1}}}
        with pytest.raises(ApiError) as denied_pool:
            limited.create(codecs.from_dict(elsewhere))  # type: ignore[call-overload]
        assert f"its own node's pool '{node}', not in pool 'another-node'" in str(denied_pool.value.status.message)

        # everything else is refused by the API server's authorizer
        refused: list[tuple[str, Callable[[], Any]]] = [
            ("list claims", lambda: list(limited.list(ResourceClaim, namespace=namespace))),
            ("list claims in all namespaces", lambda: list(limited.list(ResourceClaim, namespace="*"))),
            ("watch claims", lambda: next(iter(limited.watch(ResourceClaim, namespace=namespace)))),
            ("get a slice", lambda: limited.get(ResourceSlice, "anything")),
            ("patch a slice", lambda: limited.patch(ResourceSlice, "anything", {"metadata": {"labels": {"a": "b"}}})),
            ("deletecollection slices", lambda: limited.deletecollection(ResourceSlice)),
            ("list nodes", lambda: list(limited.list(Node))),
            ("list pods", lambda: list(limited.list(Pod, namespace=namespace))),
            ("create a claim template", lambda: limited.create(ResourceClaimTemplate.from_dict(  # type: ignore[call-overload]
                {"metadata": {"name": "t"}, "spec": {"spec": {"devices": {}}}}), namespace=namespace)),
        ]
        for what, call in refused:
            with pytest.raises(Exception) as denied:  # noqa: B017 - ApiError, or httpx's error for a watch
                call()
            assert http_status(denied.value) == 403, f"{what}: {denied.value}"
        check_device_status_authorization(kube_client, limited, kind, node, namespace)

        def patch_node() -> str | None:
            """The API server's refusal of a foreign label on the driver's own Node (None: it was let through)."""
            try:
                limited.patch(Node, node, {"metadata": {"labels": {"a": "b"}}})
            except ApiError as exc:
                return f"{exc.status.code}: {exc.status.message}"
            return None

        if kind is NEURON:
            # the Neuron driver may patch its own Node, but only the UltraServer labels (the chart's own-node policy,
            # which takes effect once the API server has loaded it)
            message = wait(patch_node, "the own-node policy to refuse a foreign label", timeout=30)
            assert "may only change the labels" in message, message
            limited.patch(Node, node, {"metadata": {"labels": {"neuron.amazonaws.com/ultraserver-mode": "1_2_4"}}})
        else:
            assert str(patch_node()).startswith("403:"), "patch its node"
    finally:
        limited.close()
        with contextlib.suppress(ApiError):
            kube_client.delete(Pod, f"{kind.driver.split('.')[0]}-driver-{node}"[:63], namespace=kind.namespace,
                               grace_period=0)


def allocate(client: Client, namespace: str, name: str, node: str, drivers: list[str]) -> None:
    """A claim with one request per driver, allocated on ``node`` as kube-scheduler writes it (device ``d<i>`` of
    each driver's pool ``node``, node selector on the Node's name)."""
    requests = [{"name": f"r{i}", "exactly": {"deviceClassName": "efa.networking.k8s.aws"}}
                for i in range(len(drivers))]
    create(client, {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": {"name": name},
                    "spec": {"devices": {"requests": requests}}}, namespace)
    results = [{"request": f"r{i}", "driver": d, "pool": node, "device": f"d{i}"} for i, d in enumerate(drivers)]
    selector = {"nodeSelectorTerms": [{"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]}]}
    client.patch(ResourceClaim.Status, name, {"status": {"allocation": {"devices": {"results": results},
                                                                         "nodeSelector": selector}}},
                 namespace=namespace)


def apply_device_status(client: Client, namespace: str, name: str, driver: str, node: str, device: str) -> None:
    body = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"name": name, "namespace": namespace},
            "status": {"devices": [{"driver": driver, "pool": node, "device": device, "data": {"probe": True},
                                    "conditions": [{"type": "Ready", "status": "True", "reason": "Prepared",
                                                    "message": "", "lastTransitionTime": "2026-12-03T17:00:00Z"}]}]}}
    client.patch(ResourceClaim.Status, name, body, namespace=namespace, patch_type=PatchType.APPLY,
                 field_manager=driver, force=True)


def check_device_status_authorization(admin: Client, limited: Client, kind: DriverKind, node: str,
                                      namespace: str) -> None:
    """Granular status authorization (Kubernetes 1.36+): with the chart's ClusterRole the driver may write
    status.devices for its own driver on claims allocated on its node, and nothing else of a claim's status."""
    other = NEURON.driver if kind is EFA else EFA.driver
    allocate(admin, namespace, "mine", node, [kind.driver, other])
    apply_device_status(limited, namespace, "mine", kind.driver, node, "d0")
    written = admin.get(ResourceClaim, "mine", namespace=namespace).to_dict()["status"]["devices"]
    assert [(e["driver"], e["device"]) for e in written] == [(kind.driver, "d0")]

    def refused(call: Callable[[], Any]) -> str:
        with pytest.raises(ApiError) as denied:
            call()
        return f"{denied.value.status.code}: {denied.value.status.message}"

    # another driver's entry: the API server asks for resourceclaims/driver named by that driver
    message = refused(lambda: apply_device_status(limited, namespace, "mine", other, node, "d1"))
    assert "resourceclaims/driver" in message, message
    # the allocation and the reservations: resourceclaims/binding (the scheduler's), not given
    message = refused(lambda: limited.patch(ResourceClaim.Status, "mine", {"status": {"reservedFor": [
        {"resource": "pods", "name": "p", "uid": "00000000-0000-0000-0000-000000000001"}]}}, namespace=namespace))
    assert "resourceclaims/binding" in message, message
    # its own driver's entry on a claim allocated on another node: only associated-node is granted
    allocate(admin, namespace, "elsewhere", "some-other-node", [kind.driver])
    message = refused(lambda: apply_device_status(limited, namespace, "elsewhere", kind.driver, "some-other-node",
                                                  "d0"))
    assert "resourceclaims/driver" in message and "arbitrary-node:patch" in message, message
