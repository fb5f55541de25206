"""The runbook of docs/charts.md, "From the device plugin to DRA, node by node", as users run it: two trn2.48xlarge
containerd nodes, both seed installs of the Neuron chart (our image, real containerd + runc, the real kubelet and
scheduler) with ``nodeSelection.driverLabel``, and ``draDriver.extendedResource`` on the DRA release.

One node moves to DRA with a device-plugin pod still running on it, an unchanged ``aws.amazon.com/neuron: 4`` pod
lands on it through DRA, and the node is rolled back to the device plugin; the other node, and its pod, stay as
they were. Both sides of the moving node (its allocatable and its ResourceSlices) are sampled every 0.25 s for the
whole test: never both at once. Expected values are facts: a trn2.48xlarge has 16 Neuron devices, ``/dev/neuron<i>``
(neuron.md), and the DRA driver names device ``i`` ``neuron-device-<i>`` (docs/neuron-dra-driver.md).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from chart_render import NEURON_CHART, SEED_DEVICE_PLUGIN_INSTALL, SEED_DRA_INSTALL
from conftest import RealNode
from lightkube import ApiError, Client, codecs
from lightkube.resources.apps_v1 import DaemonSet
from lightkube.resources.core_v1 import Event, Node, Pod
from lightkube.resources.resource_v1 import ResourceSlice
from runtime_helpers import BUSYBOX, SHOW, Helm, allocatable, container_view, device_plugin_pod, ds_row, running_1_of_1
from test_coexistence_containerd import node_events, pod_ready, sampled

from accel_core.devtools.controlplane import ControlPlane
from accel_core.devtools.kubeletnode import CONTAINERD
from accel_core.podresources import PodResourcesClient

pytestmark = pytest.mark.containerd

Wait = Callable[..., Any]
NodeFactory = Callable[..., RealNode]
TRN2_DEVICES = 16
NEURON, DRIVER, LABEL = "aws.amazon.com/neuron", "neuron.aws.com", "neuron.aws.com/driver"
DP_NS, DP_DS = "kube-system", "neuron-device-plugin"
DRA_NS, DRA_DS = "neuron-dra-driver", "neuron-dra-driver-kubelet-plugin"
RELEASE = "neuron-helm-chart"


@pytest.fixture
def helm(control_plane: ControlPlane, tmp_path: Any) -> Helm:
    return Helm(control_plane, tmp_path / "helm")


def slice_names(client: Client, node: str) -> list[str]:
    return sorted(d.name for s in client.list(ResourceSlice) if s.spec.nodeName == node and s.spec.driver == DRIVER
                  for d in s.spec.devices or [])


def ds_pods_on(client: Client, namespace: str, ds: str, node: str) -> list[Pod]:
    """The DaemonSet's pods on ``node`` that are not being deleted."""
    selector = client.get(DaemonSet, ds, namespace=namespace).spec.selector.matchLabels
    return [p for p in client.list(Pod, namespace=namespace, labels=selector)
            if p.metadata.deletionTimestamp is None and p.spec.nodeName == node]


def set_driver_label(client: Client, node: str, value: str | None) -> None:
    """``kubectl label node NODE neuron.aws.com/driver=VALUE`` (``neuron.aws.com/driver-`` for None)."""
    client.patch(Node, node, {"metadata": {"labels": {LABEL: value}}})


def running(client: Client, namespace: str, name: str) -> bool:
    return running_1_of_1(client.get(Pod, name, namespace=namespace).to_dict())


def gone(client: Client, namespace: str, name: str) -> bool:
    try:
        client.get(Pod, name, namespace=namespace)
    except ApiError as exc:
        return exc.status.code == 404
    return False


def dra_names(view_names: list[str]) -> set[str]:
    """``neuron3`` (a container's /dev/neuron3) -> ``neuron-device-3``."""
    return {"neuron-device-" + n.removeprefix("neuron") for n in view_names}


def node_events_any(client: Client, node: str) -> list[Event]:
    return [e for e in client.list(Event, namespace="default")
            if e.involvedObject.kind == "Node" and e.involvedObject.name == node]


def held_on(node: RealNode) -> dict[str, list[str]]:
    """What the node's kubelet says each pod holds (PodResources ``List``), as DRA device names: the device plugin's
    ``aws.amazon.com/neuron`` ID ``i`` (the device index) as ``neuron-device-<i>``, a DRA claim's device as is.
    Fails if any device is held twice."""
    client = PodResourcesClient(node.kubelet.layout.kubelet_root / "pod-resources" / "kubelet.sock")
    try:
        response = client.list()
    finally:
        client.close()
    out: dict[str, list[str]] = {}
    for pod in response.pod_resources:
        names = [f"neuron-device-{i}" for c in pod.containers for d in c.devices if d.resource_name == NEURON
                 for i in d.device_ids]
        names += [r.device_name for c in pod.containers for dyn in c.dynamic_resources for r in dyn.claim_resources
                  if r.driver_name == DRIVER]
        if names:
            out[pod.name] = sorted(names)
    every = [n for names in out.values() for n in names]
    assert len(every) == len(set(every)), f"a device held twice on {node.name}: {out}"
    return out


def unchanged_neuron_4_pod(name: str, node: str) -> dict[str, Any]:
    """A device-plugin pod spec as users have it (``aws.amazon.com/neuron: 4``), kept on ``node`` by node affinity
    (the scheduler places it, unlike nodeName)."""
    affinity = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
        {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]}]}}}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
            "spec": {"affinity": affinity, "restartPolicy": "Never", "terminationGracePeriodSeconds": 1,
                     "tolerations": [{"operator": "Exists"}],
                     "containers": [{"name": "app", "image": BUSYBOX, "imagePullPolicy": "Never",
                                     "command": ["sh", "-c", SHOW], "resources": {"limits": {NEURON: "4"}}}]}}


def test_neuron_node_by_node_migration_and_rollback(kubelet_node: NodeFactory, kube_client: Client,
                                                    control_plane: ControlPlane, helm: Helm, namespace: str,
                                                    wait: Wait) -> None:
    """docs/charts.md's runbook on two trn2.48xlarge nodes: label node 2 for DRA with a device-plugin pod running
    on it, run an unchanged neuron: 4 pod there through DRA, end the old pod, roll node 2 back; node 1 and its pod
    are untouched throughout, and no device is ever offered or held twice."""
    n1, n2 = (kubelet_node("trn2.48xlarge", runtime=CONTAINERD) for _ in range(2))
    node1, node2 = n1.name, n2.name
    assert n1.kubelet.layout.fake_host_path == n2.kubelet.layout.fake_host_path  # one release serves both nodes
    flags = ["--set", "image.pullPolicy=Never", "--set", f"fakeHost.path={n1.kubelet.layout.fake_host_path}",
             "--set", f"nodeSelection.driverLabel={LABEL}"]
    helm.seed(SEED_DEVICE_PLUGIN_INSTALL, NEURON_CHART, *flags)
    helm.seed(SEED_DRA_INSTALL, NEURON_CHART, *flags, "--set", "draDriver.extendedResource=true")
    create = lambda doc: kube_client.create(codecs.from_dict(doc), namespace=namespace)  # noqa: E731
    try:
        with sampled(control_plane, node2, NEURON, DRIVER) as sides, \
                sampled(control_plane, node1, NEURON, DRIVER) as sides1:
            # 1. Before any label: the device plugin serves both nodes; the DRA driver runs nowhere.
            wait(lambda: allocatable(kube_client, node1, NEURON) == TRN2_DEVICES
                 and allocatable(kube_client, node2, NEURON) == TRN2_DEVICES, "neuron 16 on both nodes", timeout=180)
            wait(lambda: ds_row(kube_client, DP_NS, DP_DS)["ready"] == 2, "the device plugin ready on both nodes")
            assert ds_row(kube_client, DRA_NS, DRA_DS)["desired"] == 0, "a DRA driver pod on an unlabelled node"
            assert slice_names(kube_client, node1) == slice_names(kube_client, node2) == []
            settled = time.monotonic()

            # 2. Device-plugin pods: A on node 2 (the node that moves), B on node 1.
            create(device_plugin_pod("a", NEURON, 4, node2))
            create(device_plugin_pod("b", NEURON, 4, node1))
            wait(lambda: running(kube_client, namespace, "a") and running(kube_client, namespace, "b"),
                 "pods A and B Running", timeout=120)
            a_devices = dra_names(container_view(n2.kubelet, namespace, "a", wait).names("neuron"))
            assert len(a_devices) == 4, a_devices
            b_uid = kube_client.get(Pod, "b", namespace=namespace).metadata.uid

            # 3. Node 2 moves to DRA: the device plugin's pod leaves it, the DRA driver's starts, and the slices
            # leave out exactly A's devices (A still holds them through the device plugin).
            t0 = time.monotonic()
            set_driver_label(kube_client, node2, "dra")
            every = {f"neuron-device-{i}" for i in range(TRN2_DEVICES)}
            wait(lambda: set(slice_names(kube_client, node2)) == every - a_devices
                 and allocatable(kube_client, node2, NEURON) == 0, "node 2 served by DRA: 12 devices, not A's",
                 timeout=180)
            to_dra = time.monotonic() - t0
            wait(lambda: not ds_pods_on(kube_client, DP_NS, DP_DS, node2), "no device plugin pod on node 2")
            wait(lambda: pod_ready(next(iter(ds_pods_on(kube_client, DRA_NS, DRA_DS, node2)), None)),
                 "the DRA driver pod ready on node 2")
            assert ds_row(kube_client, DRA_NS, DRA_DS)["desired"] == 1
            assert ds_row(kube_client, DP_NS, DP_DS)["desired"] == 1
            assert allocatable(kube_client, node1, NEURON) == TRN2_DEVICES and slice_names(kube_client, node1) == []
            assert running(kube_client, namespace, "a") and running(kube_client, namespace, "b")
            assert held_on(n2) == {"a": sorted(a_devices)}, "PodResources of node 2 disagree with A's container"

            # 4. An unchanged neuron: 4 pod lands on node 2 through DRA (the scheduler's extended-resource claim),
            # on devices A does not hold.
            create(unchanged_neuron_4_pod("c", node2))
            wait(lambda: running(kube_client, namespace, "c"), "pod C Running on node 2", timeout=120)
            c_pod = kube_client.get(Pod, "c", namespace=namespace).to_dict()
            assert c_pod["spec"]["nodeName"] == node2
            mapping = c_pod["status"].get("extendedResourceClaimStatus") or {}
            assert mapping.get("resourceClaimName") and mapping["requestMappings"][0]["resourceName"] == NEURON, \
                c_pod["status"]
            c_devices = dra_names(container_view(n2.kubelet, namespace, "c", wait).names("neuron"))
            assert len(c_devices) == 4 and not c_devices & a_devices, (sorted(c_devices), sorted(a_devices))
            assert held_on(n2) == {"a": sorted(a_devices), "c": sorted(c_devices)}

            # 5. A ends: its devices go back into node 2's slices within seconds.
            t1 = time.monotonic()
            kube_client.delete(Pod, "a", namespace=namespace, grace_period=1)
            wait(lambda: set(slice_names(kube_client, node2)) == every, "node 2's slices back to 16", timeout=30)
            freed = time.monotonic() - t1
            assert freed < 15, f"A's devices came back into the slices only after {freed:.1f}s"

            # 6. Rollback: the label removed, the DRA driver leaves (and takes its slices), the device plugin serves
            # node 2 again, without C's 4 devices (held by C's DRA claim: advertised unhealthy).
            t2, unlabelled = time.monotonic(), datetime.now(UTC) - timedelta(seconds=1)
            set_driver_label(kube_client, node2, None)
            wait(lambda: allocatable(kube_client, node2, NEURON) == TRN2_DEVICES - 4
                 and slice_names(kube_client, node2) == [], "node 2 back on the device plugin: neuron 12, no slices",
                 timeout=120)
            to_plugin = time.monotonic() - t2
            wait(lambda: not ds_pods_on(kube_client, DRA_NS, DRA_DS, node2), "no DRA driver pod on node 2")
            assert ds_row(kube_client, DRA_NS, DRA_DS)["desired"] == 0
            try:
                wait(lambda: [e for e in node_events(kube_client, node2, "DevicePluginServing")
                              if e.firstTimestamp is not None and e.firstTimestamp >= unlabelled],
                     "a Node event: the plugin serves")
            except TimeoutError as exc:
                dp = ds_pods_on(kube_client, DP_NS, DP_DS, node2)
                log = n2.kubelet.pod_log(DP_NS, dp[0].metadata.name, dp[0].spec.containers[0].name) if dp else ""
                seen = [(e.reason, e.message) for e in node_events_any(kube_client, node2)]
                raise AssertionError(f"{exc}; node 2 events: {seen}; its device plugin's log:\n{log}") from exc
            assert running(kube_client, namespace, "c") and held_on(n2) == {"c": sorted(c_devices)}

            # Cleanup as the runbook has it: C's claim can be unprepared only through its driver, so node 2 goes back
            # to DRA before C is deleted.
            set_driver_label(kube_client, node2, "dra")
            wait(lambda: len(slice_names(kube_client, node2)) == TRN2_DEVICES
                 and allocatable(kube_client, node2, NEURON) == 0, "node 2 on DRA again", timeout=180)
            kube_client.delete(Pod, "c", namespace=namespace, grace_period=1)
            wait(lambda: gone(kube_client, namespace, "c"), "pod C gone once its claim is unprepared", timeout=120)

            # Node 1 and its pod never noticed.
            b = kube_client.get(Pod, "b", namespace=namespace)
            assert b.metadata.uid == b_uid and running(kube_client, namespace, "b")
            assert (b.status.containerStatuses or [])[0].restartCount == 0
            changed = [s for s in sides1.samples if s[0] >= settled and (s[1] != TRN2_DEVICES or s[2] != 0)]
            assert changed == [], f"node 1's allocatable or slices changed: {changed[:5]}"
            # The sampler of node 2 saw each side serve it (one at a time).
            assert [s for s in sides.samples if s[1] > 0] and [s for s in sides.samples if s[2] > 0], sides.samples
        print(f"\n[figure] Neuron migration: label {LABEL}=dra to DRA serving node 2 (12 devices) {to_dra:.1f}s; "
              f"device-plugin pod ended to its 4 devices in the slices {freed:.1f}s; label removed to device-plugin "
              f"serving (neuron 12) {to_plugin:.1f}s")
    finally:
        for pod in ("a", "b", "c"):
            with contextlib.suppress(ApiError):
                kube_client.delete(Pod, pod, namespace=namespace, grace_period=1)
        with contextlib.suppress(AssertionError):
            helm("uninstall", RELEASE, "--namespace", DRA_NS, "--wait", "--timeout", "120s")
        helm("uninstall", RELEASE, "--wait", "--timeout", "120s")
