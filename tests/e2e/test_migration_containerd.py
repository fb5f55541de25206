"""The runbook of docs/charts.md, "From the device plugin to DRA, node by node", as users run it, on two containerd
nodes (our image, real containerd + runc, the real kubelet and scheduler): Neuron on two trn2.48xlarge with both
seed installs of the Neuron chart, EFA on two p5.48xlarge with the `efa` and `efa-dra` releases; all with
``nodeSelection.driverLabel``, and ``draDriver.extendedResource`` on the DRA release.

One node moves to DRA with a device-plugin pod still running on it, an unchanged device-plugin pod spec
(``aws.amazon.com/neuron: 4``, ``vpc.amazonaws.com/efa: 8``) lands on it through DRA, and the node is rolled back
to the device plugin; the other node, and its pod, stay as they were. Both sides of the moving node (its allocatable
and its ResourceSlices) are sampled every 0.25 s for the whole test: never both at once; the kubelet's PodResources
and the containers' own device nodes show no device held twice. Expected values are facts: a trn2.48xlarge has 16
Neuron devices, ``/dev/neuron<i>`` (neuron.md); a p5.48xlarge 32 EFAs (efa.md); the device names of each side are
those the docs give (see :data:`NEURON`, :data:`EFA`).
"""

from __future__ import annotations

import contextlib
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from accel_rig.controlplane import ControlPlane
from accel_rig.nodelayout import CONTAINERD
from chart_render import EFA_CHART, NEURON_CHART, SEED_DEVICE_PLUGIN_INSTALL, SEED_DRA_INSTALL
from conftest import RealNode
from lightkube import ApiError, Client, codecs
from lightkube.resources.apps_v1 import DaemonSet
from lightkube.resources.core_v1 import Event, Node, Pod
from lightkube.resources.resource_v1 import ResourceSlice
from runtime_helpers import (
    BUSYBOX,
    SHOW,
    Helm,
    allocatable,
    container_view,
    device_plugin_pod,
    ds_row,
    node_events,
    pod_ready,
    running_1_of_1,
    sampled,
)

from accel_core.podresources import PodResourcesClient

pytestmark = pytest.mark.containerd

Wait = Callable[..., Any]
NodeFactory = Callable[..., RealNode]


@dataclass(frozen=True)
class Kind:
    """One accelerator's migration: its releases, its label, and how its devices are named on each side."""

    what: str
    instance_type: str
    resource: str
    driver: str
    label: str
    dp: tuple[str, str]  #: the device plugin's DaemonSet (namespace, name)
    dra: tuple[str, str]  #: the DRA driver's DaemonSet (namespace, name)
    total: int  #: devices of the instance type (facts: neuron.md, efa.md)
    take: int  #: what each workload pod asks for
    node_prefix: str  #: its device nodes in a container (/dev/neuron<i>, /dev/infiniband/uverbs<i>)
    dra_name: Callable[[str], str]  #: the device plugin's device ID -> the DRA driver's device name
    install: Callable[[Helm, list[str]], None]
    uninstall: Callable[[Helm], None]


def neuron_install(helm: Helm, flags: list[str]) -> None:
    helm.seed(SEED_DEVICE_PLUGIN_INSTALL, NEURON_CHART, *flags)
    helm.seed(SEED_DRA_INSTALL, NEURON_CHART, *flags, "--set", "draDriver.extendedResource=true")


def neuron_uninstall(helm: Helm) -> None:
    with contextlib.suppress(AssertionError):
        helm("uninstall", "neuron-helm-chart", "--namespace", "neuron-dra-driver", "--wait", "--timeout", "120s")
    helm("uninstall", "neuron-helm-chart", "--wait", "--timeout", "120s")


def efa_install(helm: Helm, flags: list[str]) -> None:
    helm("upgrade", "--install", "efa", str(EFA_CHART), "-n", "kube-system", *flags)
    helm("upgrade", "--install", "efa-dra", str(EFA_CHART), "-n", "kube-system", "--set", "devicePlugin.enabled=false",
         "--set", "draDriver.enabled=true", "--set", "draDriver.extendedResource=true", *flags)


def efa_uninstall(helm: Helm) -> None:
    with contextlib.suppress(AssertionError):
        helm("uninstall", "efa-dra", "-n", "kube-system", "--wait", "--timeout", "120s")
    helm("uninstall", "efa", "-n", "kube-system", "--wait", "--timeout", "120s")


#: Neuron: the device plugin's ID is the device index, the DRA device ``neuron-device-<index>``
#: (docs/neuron-dra-driver.md); EFA: the device plugin's ID is the PCI address, the DRA device ``efa-`` and the
#: address with ``:`` and ``.`` as ``-`` (docs/efa-dra-driver.md).
NEURON = Kind("Neuron", "trn2.48xlarge", "aws.amazon.com/neuron", "neuron.aws.com", "neuron.aws.com/driver",
              ("kube-system", "neuron-device-plugin"), ("neuron-dra-driver", "neuron-dra-driver-kubelet-plugin"),
              16, 4, "neuron", lambda i: f"neuron-device-{i}", neuron_install, neuron_uninstall)
EFA = Kind("EFA", "p5.48xlarge", "vpc.amazonaws.com/efa", "efa.aws.com", "efa.aws.com/driver",
           ("kube-system", "aws-efa-k8s-device-plugin-daemonset"),
           ("kube-system", "aws-efa-k8s-device-plugin-dra-driver"),
           32, 8, "uverbs", lambda pci: "efa-" + re.sub(r"[^0-9a-z]", "-", pci.lower()), efa_install, efa_uninstall)


@pytest.fixture
def helm(control_plane: ControlPlane, tmp_path: Any) -> Helm:
    return Helm(control_plane, tmp_path / "helm", hooks=True)


def slice_names(client: Client, node: str, kind: Kind) -> set[str]:
    return {d.name for s in client.list(ResourceSlice) if s.spec.nodeName == node and s.spec.driver == kind.driver
            for d in s.spec.devices or []}


def ds_pods_on(client: Client, ds: tuple[str, str], node: str) -> list[Pod]:
    """The DaemonSet's pods on ``node`` that are not being deleted."""
    namespace, name = ds
    selector = client.get(DaemonSet, name, namespace=namespace).spec.selector.matchLabels
    return [p for p in client.list(Pod, namespace=namespace, labels=selector)
            if p.metadata.deletionTimestamp is None and p.spec.nodeName == node]


def set_driver_label(client: Client, node: str, kind: Kind, value: str | None) -> None:
    """``kubectl label node NODE <label>=VALUE`` (``<label>-`` for None)."""
    client.patch(Node, node, {"metadata": {"labels": {kind.label: value}}})


def running(client: Client, namespace: str, name: str) -> bool:
    return running_1_of_1(client.get(Pod, name, namespace=namespace).to_dict())


def gone(client: Client, namespace: str, name: str) -> bool:
    try:
        client.get(Pod, name, namespace=namespace)
    except ApiError as exc:
        return exc.status.code == 404
    return False


def node_events_any(client: Client, node: str) -> list[Event]:
    return [e for e in client.list(Event, namespace="default")
            if e.involvedObject.kind == "Node" and e.involvedObject.name == node]


def held_on(node: RealNode, kind: Kind) -> dict[str, set[str]]:
    """What the node's kubelet says each pod holds (PodResources ``List``), as DRA device names: the device plugin's
    IDs through ``kind.dra_name``, a DRA claim's devices as they are. Fails if any device is held twice."""
    client = PodResourcesClient(node.kubelet.layout.kubelet_root / "pod-resources" / "kubelet.sock")
    try:
        response = client.list()
    finally:
        client.close()
    out: dict[str, set[str]] = {}
    for pod in response.pod_resources:
        names = [kind.dra_name(i) for c in pod.containers for d in c.devices if d.resource_name == kind.resource
                 for i in d.device_ids]
        names += [r.device_name for c in pod.containers for dyn in c.dynamic_resources for r in dyn.claim_resources
                  if r.driver_name == kind.driver]
        if names:
            assert len(names) == len(set(names)), f"{pod.name} holds a device twice: {names}"
            out[pod.name] = set(names)
    every = [n for names in out.values() for n in names]
    assert len(every) == len(set(every)), f"a device held twice on {node.name}: {out}"
    return out


def unchanged_pod(name: str, node: str, resource: str, count: int) -> dict[str, Any]:
    """A device-plugin pod spec as users have it (``<resource>: <count>``), kept on ``node`` by node affinity (the
    scheduler places it, unlike nodeName)."""
    affinity = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
        {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]}]}}}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
            "spec": {"affinity": affinity, "restartPolicy": "Never", "terminationGracePeriodSeconds": 1,
                     "tolerations": [{"operator": "Exists"}],
                     "containers": [{"name": "app", "image": BUSYBOX, "imagePullPolicy": "Never",
                                     "command": ["sh", "-c", SHOW], "resources": {"limits": {resource: str(count)}}}]}}


@pytest.mark.parametrize("kind", [NEURON, EFA], ids=["neuron", "efa"])
def test_node_by_node_migration_and_rollback(kind: Kind, kubelet_node: NodeFactory, kube_client: Client,
                                             control_plane: ControlPlane, helm: Helm, namespace: str,
                                             wait: Wait) -> None:
    """docs/charts.md's runbook on two nodes: label node 2 for DRA with a device-plugin pod A running on it, run an
    unchanged device-plugin pod spec C there through DRA, end A, roll node 2 back; node 1 and its pod B are
    untouched throughout, and no device is ever offered or held twice."""
    n1, n2 = (kubelet_node(kind.instance_type, runtime=CONTAINERD) for _ in range(2))
    node1, node2 = n1.name, n2.name
    assert n1.kubelet.layout.fake_host_path == n2.kubelet.layout.fake_host_path  # one release serves both nodes
    kind.install(helm, ["--set", "image.pullPolicy=Never", "--set", f"fakeHost.path={n1.kubelet.layout.fake_host_path}",
                        "--set", f"nodeSelection.driverLabel={kind.label}"])
    create = lambda doc: kube_client.create(codecs.from_dict(doc), namespace=namespace)  # noqa: E731
    alloc = lambda node: allocatable(kube_client, node, kind.resource)  # noqa: E731
    total, take = kind.total, kind.take
    try:
        with sampled(control_plane, node2, kind.resource, kind.driver) as sides, \
                sampled(control_plane, node1, kind.resource, kind.driver) as sides1:
            # 1. Before any label: the device plugin serves both nodes; the DRA driver runs nowhere.
            wait(lambda: alloc(node1) == alloc(node2) == total, f"{total} on both nodes", timeout=180)
            wait(lambda: ds_row(kube_client, *kind.dp)["ready"] == 2, "the device plugin ready on both nodes")
            assert ds_row(kube_client, *kind.dra)["desired"] == 0, "a DRA driver pod on an unlabelled node"
            assert slice_names(kube_client, node1, kind) == slice_names(kube_client, node2, kind) == set()
            settled = time.monotonic()

            # 2. Device-plugin pods: A on node 2 (the node that moves), B on node 1.
            create(device_plugin_pod("a", kind.resource, take, node2))
            create(device_plugin_pod("b", kind.resource, take, node1))
            wait(lambda: running(kube_client, namespace, "a") and running(kube_client, namespace, "b"),
                 "pods A and B Running", timeout=120)
            a_nodes = set(container_view(n2.kubelet, namespace, "a", wait).names(kind.node_prefix))
            a_devices = held_on(n2, kind)["a"]
            assert len(a_nodes) == len(a_devices) == take, (a_nodes, a_devices)
            if kind is NEURON:  # /dev/neuron<i> is device i
                assert a_devices == {kind.dra_name(n.removeprefix("neuron")) for n in a_nodes}
            b_uid = kube_client.get(Pod, "b", namespace=namespace).metadata.uid

            # 3. Node 2 moves to DRA: the device plugin's pod leaves it, the DRA driver's starts, and the slices
            # leave out exactly A's devices (A still holds them through the device plugin).
            t0 = time.monotonic()
            set_driver_label(kube_client, node2, kind, "dra")
            wait(lambda: len(names := slice_names(kube_client, node2, kind)) == total - take
                 and not names & a_devices and alloc(node2) == 0,
                 f"node 2 served by DRA: {total - take} devices, none of A's", timeout=180)
            to_dra = time.monotonic() - t0
            wait(lambda: not ds_pods_on(kube_client, kind.dp, node2), "no device plugin pod on node 2")
            wait(lambda: pod_ready(next(iter(ds_pods_on(kube_client, kind.dra, node2)), None)),
                 "the DRA driver pod ready on node 2")
            assert ds_row(kube_client, *kind.dra)["desired"] == 1 and ds_row(kube_client, *kind.dp)["desired"] == 1
            assert alloc(node1) == total and slice_names(kube_client, node1, kind) == set()
            assert running(kube_client, namespace, "a") and running(kube_client, namespace, "b")
            assert held_on(n2, kind) == {"a": a_devices}

            # 4. An unchanged pod spec lands on node 2 through DRA (the scheduler's extended-resource claim), on
            # devices A does not hold.
            create(unchanged_pod("c", node2, kind.resource, take))
            wait(lambda: running(kube_client, namespace, "c"), "pod C Running on node 2", timeout=120)
            c_pod = kube_client.get(Pod, "c", namespace=namespace).to_dict()
            assert c_pod["spec"]["nodeName"] == node2
            mapping = c_pod["status"].get("extendedResourceClaimStatus") or {}
            assert mapping.get("resourceClaimName"), c_pod["status"]
            assert mapping["requestMappings"][0]["resourceName"] == kind.resource, mapping
            c_nodes = set(container_view(n2.kubelet, namespace, "c", wait).names(kind.node_prefix))
            assert len(c_nodes) == take and not c_nodes & a_nodes, (sorted(c_nodes), sorted(a_nodes))
            c_devices = held_on(n2, kind)["c"]
            assert len(c_devices) == take and not c_devices & a_devices and held_on(n2, kind).keys() == {"a", "c"}
            if kind is NEURON:
                assert c_devices == {kind.dra_name(n.removeprefix("neuron")) for n in c_nodes}

            # 5. A ends: its devices go back into node 2's slices within seconds.
            t1 = time.monotonic()
            kube_client.delete(Pod, "a", namespace=namespace, grace_period=1)
            wait(lambda: len(slice_names(kube_client, node2, kind)) == total, f"node 2's slices back to {total}",
                 timeout=30)
            freed = time.monotonic() - t1
            assert freed < 15, f"A's devices came back into the slices only after {freed:.1f}s"

            # 6. Rollback: the label removed, the DRA driver leaves (and takes its slices), the device plugin serves
            # node 2 again, without C's devices (held by C's DRA claim: advertised unhealthy).
            t2, unlabelled = time.monotonic(), datetime.now(UTC) - timedelta(seconds=1)
            set_driver_label(kube_client, node2, kind, None)
            wait(lambda: alloc(node2) == total - take and not slice_names(kube_client, node2, kind),
                 f"node 2 back on the device plugin: {total - take}, no slices", timeout=120)
            to_plugin = time.monotonic() - t2
            wait(lambda: not ds_pods_on(kube_client, kind.dra, node2), "no DRA driver pod on node 2")
            assert ds_row(kube_client, *kind.dra)["desired"] == 0
            try:
                wait(lambda: [e for e in node_events(kube_client, node2, "DevicePluginServing")
                              if e.firstTimestamp is not None and e.firstTimestamp >= unlabelled],
                     "a Node event: the plugin serves")
            except TimeoutError as exc:
                dp = ds_pods_on(kube_client, kind.dp, node2)
                log = n2.kubelet.pod_log(kind.dp[0], dp[0].metadata.name, dp[0].spec.containers[0].name) if dp else ""
                seen = [(e.reason, e.message) for e in node_events_any(kube_client, node2)]
                raise AssertionError(f"{exc}; node 2 events: {seen}; its device plugin's log:\n{log}") from exc
            assert running(kube_client, namespace, "c") and held_on(n2, kind) == {"c": c_devices}

            # C deleted now: its claim can be unprepared only through its driver, so its devices stay held (never
            # advertised by the device plugin) until node 2 goes back to DRA and the kubelet unprepares it.
            kube_client.delete(Pod, "c", namespace=namespace, grace_period=1)
            time.sleep(5)
            assert alloc(node2) == total - take and held_on(n2, kind) == {"c": c_devices}, "C's devices freed"
            set_driver_label(kube_client, node2, kind, "dra")
            wait(lambda: gone(kube_client, namespace, "c"), "pod C gone once its claim is unprepared", timeout=120)
            wait(lambda: len(slice_names(kube_client, node2, kind)) == total and alloc(node2) == 0
                 and held_on(n2, kind) == {}, "node 2 on DRA again, nothing held", timeout=180)

            # Node 1 and its pod never noticed.
            b = kube_client.get(Pod, "b", namespace=namespace)
            assert b.metadata.uid == b_uid and running(kube_client, namespace, "b")
            assert (b.status.containerStatuses or [])[0].restartCount == 0
            changed = [s for s in sides1.samples if s[0] >= settled and (s[1] != total or s[2] != 0)]
            assert changed == [], f"node 1's allocatable or slices changed: {changed[:5]}"
            # The sampler of node 2 saw each side serve it (one at a time).
            assert [s for s in sides.samples if s[1] > 0] and [s for s in sides.samples if s[2] > 0], sides.samples
        print(f"\n[figure] {kind.what} migration: label {kind.label}=dra to DRA serving node 2 ({total - take} "
              f"devices) {to_dra:.1f}s; device-plugin pod ended to its {take} devices in the slices {freed:.1f}s; "
              f"label removed to device-plugin serving ({total - take}) {to_plugin:.1f}s")
    finally:
        for pod in ("a", "b", "c"):
            with contextlib.suppress(ApiError):
                kube_client.delete(Pod, pod, namespace=namespace, grace_period=1)
        kind.uninstall(helm)
