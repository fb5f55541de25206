"""Install the charts on the real control plane with the commands of the AWS documents.

Every object must be accepted, the DaemonSets must place pods on the nodes their selection names (kube-scheduler
binds them; no kubelet runs them), and the Neuron DRA driver's ServiceAccount, holding a token bound to its own Pod,
may write the ResourceSlices of that Pod's node and no other.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
from accel_rig.controlplane import ControlPlane
from chart_render import (
    EFA_CHART,
    NEURON_CHART,
    SEED_DEVICE_PLUGIN_INSTALL,
    SEED_DRA_INSTALL,
)
from lightkube import ApiError, Client, KubeConfig, codecs
from lightkube.core.resource import GlobalResource, NamespacedResource
from lightkube.resources.admissionregistration_v1 import ValidatingAdmissionPolicy, ValidatingAdmissionPolicyBinding
from lightkube.resources.apps_v1 import DaemonSet, Deployment
from lightkube.resources.core_v1 import ConfigMap, Namespace, Node, Pod, Secret, Service, ServiceAccount
from lightkube.resources.networking_v1 import NetworkPolicy
from lightkube.resources.rbac_authorization_v1 import ClusterRole, ClusterRoleBinding, Role, RoleBinding
from lightkube.resources.resource_v1 import DeviceClass, ResourceClaim, ResourceSlice
from runtime_helpers import Helm

Wait = Callable[..., Any]
FakeNode = Callable[..., str]

DRA_NS = "neuron-dra-driver"
DRA_SA = "neuron-dra-driver-sa"
NPD_NS = "neuron-healthcheck-system"
INSTANCE_TYPE = "node.kubernetes.io/instance-type"
OWN_NODE_ONLY = "may only write ResourceSlices of its own node"

KINDS: dict[str, type[GlobalResource] | type[NamespacedResource]] = {
    "DaemonSet": DaemonSet,
    "Deployment": Deployment,
    "Role": Role,
    "RoleBinding": RoleBinding,
    "ServiceAccount": ServiceAccount,
    "Service": Service,
    "ConfigMap": ConfigMap,
    "Namespace": Namespace,
    "ClusterRole": ClusterRole,
    "ClusterRoleBinding": ClusterRoleBinding,
    "DeviceClass": DeviceClass,
    "ValidatingAdmissionPolicy": ValidatingAdmissionPolicy,
    "ValidatingAdmissionPolicyBinding": ValidatingAdmissionPolicyBinding,
    "Secret": Secret,
    "NetworkPolicy": NetworkPolicy,
}


@pytest.fixture
def helm(control_plane: ControlPlane, tmp_path: Path) -> Helm:
    return Helm(control_plane, tmp_path)


def as_dict(obj: Any) -> Any:
    return obj.to_dict()


def assert_all_present(kube_client: Client, docs: list[dict[str, Any]]) -> None:
    """Every object of a release exists in the API server as rendered (kind, name, namespace)."""
    assert docs
    for doc in docs:
        kind, meta = doc["kind"], doc["metadata"]
        resource: Any = KINDS[kind]
        got: Any = kube_client.get(resource, meta["name"], namespace=meta.get("namespace"))
        assert as_dict(got)["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "Helm", (kind, meta["name"])


def daemonset_pods(kube_client: Client, namespace: str, labels: Mapping[str, str]) -> dict[str, str]:
    """node name -> pod name for the DaemonSet's pods (the node the DaemonSet controller created each pod for)."""
    out: dict[str, str] = {}
    for pod in kube_client.list(Pod, namespace=namespace, labels=dict(labels)):
        pod_dict = as_dict(pod)
        if pod_dict["metadata"].get("deletionTimestamp"):
            continue  # left over from an uninstall: no kubelet confirms the end of pods on fake nodes
        spec = pod_dict["spec"]
        terms = spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
        target = next(f["values"][0] for t in terms for f in t.get("matchFields", []) if f["key"] == "metadata.name")
        out[target] = pod_dict["metadata"]["name"]
    return out


def slice_for(node: str, driver: str = "neuron.aws.com", pool: str | None = None) -> Any:
    return codecs.from_dict(
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceSlice",
            "metadata": {"generateName": f"{node}-{driver}-"},
            "spec": {
                "driver": driver,
                "nodeName": node,
                "pool": {"name": pool or node, "generation": 1, "resourceSliceCount": 1},
                "devices": [{"name": "neuron-device-0", "attributes": {"index": {"int": 0}}}],
            },
        }
    )


@contextlib.contextmanager
def uninstalled_after(helm: Helm, release: str, namespace: str) -> Iterator[None]:
    """``helm uninstall`` the release afterwards; its failure fails the test unless the test failed already."""
    try:
        yield
    except BaseException:
        with contextlib.suppress(AssertionError):
            helm("uninstall", release, "--namespace", namespace)
        raise
    helm("uninstall", release, "--namespace", namespace)


def absent(kube_client: Client, resource: Any, name: str) -> bool:
    try:
        kube_client.get(resource, name)
    except ApiError as e:
        return e.status.code == 404
    return False


# --------------------------------------------------------------------------------------------------------------------


def test_seed_dra_install_and_slices_limited_to_own_node(
    control_plane: ControlPlane, kube_client: Client, helm: Helm, fake_node: FakeNode, wait: Wait
) -> None:
    node_a = fake_node(labels={INSTANCE_TYPE: "trn2.48xlarge"})
    node_b = fake_node(labels={INSTANCE_TYPE: "trn2.48xlarge"})
    other = fake_node(labels={INSTANCE_TYPE: "m5.large"})
    admin_slices: list[str] = []
    try:
        with uninstalled_after(helm, "neuron-helm-chart", DRA_NS):
            notes = helm.seed(SEED_DRA_INSTALL, NEURON_CHART)
            # The install prints the guide's verification commands.
            assert "kubectl get ds -n neuron-dra-driver neuron-dra-driver-kubelet-plugin" in notes
            assert "kubectl get deviceclass neuron.aws.com" in notes
            docs = helm.manifest("neuron-helm-chart", DRA_NS)
            assert {d["kind"] for d in docs} == {
                "ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Service", "DaemonSet", "DeviceClass",
                "ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding",
                "Role", "RoleBinding",  # get of its own DaemonSet at shutdown: uninstalled, or restarting?
            }  # fmt: skip
            assert_all_present(kube_client, docs)
            # What the guide's kubectl commands look at.
            kube_client.get(DaemonSet, "neuron-dra-driver-kubelet-plugin", namespace=DRA_NS)
            kube_client.get(DeviceClass, "neuron.aws.com")

            selector = {"app.kubernetes.io/name": "neuron-dra-driver"}
            pods = wait(
                lambda: (p := daemonset_pods(kube_client, DRA_NS, selector)) and {node_a, node_b} <= p.keys() and p,
                "the DaemonSet controller to create driver pods on both Neuron nodes",
            )
            assert other not in pods
            pod_a = pods[node_a]
            wait(
                lambda: as_dict(kube_client.get(Pod, pod_a, namespace=DRA_NS))["spec"].get("nodeName") == node_a,
                f"kube-scheduler to bind {pod_a} to {node_a}",
            )
            # The driver's credentials: a token bound to its own pod, so it names node A.
            token = control_plane.mint_token(DRA_NS, DRA_SA, bound_pod=pod_a)
            with Client(KubeConfig.from_file(control_plane.kubeconfig_for_token(token))) as driver:
                check_slice_writes(kube_client, driver, node_a, node_b, admin_slices, wait)
                check_rbac(driver, node_a)
        for resource, name in [(DeviceClass, "neuron.aws.com"), (ClusterRole, "neuron-dra-driver"),
                               (ValidatingAdmissionPolicy, "neuron-dra-driver-resourceslices")]:  # fmt: skip
            assert absent(kube_client, resource, name), f"helm uninstall left {name}"
    finally:
        for name in admin_slices:
            with contextlib.suppress(ApiError):
                kube_client.delete(ResourceSlice, name)
        remove_namespace(kube_client, DRA_NS, wait)


def remove_namespace(kube_client: Client, namespace: str, wait: Wait) -> None:
    """Delete a namespace and wait until it is gone, so later tests can create it again.

    Without a kubelet, deleted pods on fake nodes stay Terminating and would hold the namespace forever, so they
    are force-deleted (grace period 0) first.
    """
    with contextlib.suppress(ApiError):
        for pod in kube_client.list(Pod, namespace=namespace):
            with contextlib.suppress(ApiError):
                kube_client.delete(Pod, pod.metadata.name, namespace=namespace, grace_period=0)
        kube_client.delete(Namespace, namespace)

    def gone() -> bool:
        try:
            kube_client.get(Namespace, namespace)
        except ApiError as exc:
            return exc.status.code == 404
        return False

    wait(gone, f"namespace {namespace} to be deleted")


def refusal(action: Callable[[], object]) -> str:
    """Run an API call that must be refused by admission; return the API server's message."""
    with pytest.raises(ApiError) as err:
        action()
    assert err.value.status.code in (403, 422), err.value.status.message
    return err.value.status.message or ""


def check_slice_writes(
    admin: Client, driver: Client, node_a: str, node_b: str, admin_slices: list[str], wait: Wait
) -> None:
    # The policy takes effect once the API server has loaded it; until then RBAC alone would let this through.
    def refused_on_b() -> str | None:
        try:
            created: Any = driver.create(slice_for(node_b))
        except ApiError as e:
            return e.status.message if e.status.code in (403, 422) else None
        admin.delete(ResourceSlice, created.metadata.name)
        return None

    message = wait(refused_on_b, "the ValidatingAdmissionPolicy to refuse a slice of another node")
    assert OWN_NODE_ONLY in message and f"node '{node_b}'" in message

    own: Any = driver.create(slice_for(node_a))
    name = own.metadata.name
    own.metadata.labels = {"updated": "yes"}
    updated: Any = driver.replace(own)
    assert updated.metadata.labels == {"updated": "yes"}
    driver.delete(ResourceSlice, name)

    message = refusal(lambda: driver.create(slice_for(node_a, driver="other.example.com")))
    assert "only write ResourceSlices of driver neuron.aws.com" in message

    # issue 25 item 9: node A's token may not put a slice of its own node into node B's pool (the API server keeps
    # a pool name from changing), nor delete one someone else put there
    message = refusal(lambda: driver.create(slice_for(node_a, pool=node_b)))
    assert f"may only write ResourceSlices in its own node's pool '{node_a}', not in pool '{node_b}'" in message
    odd: Any = admin.create(slice_for(node_a, pool=node_b))  # one the admin put into B's pool on A
    admin_slices.append(odd.metadata.name)
    assert f"may only change ResourceSlices in its own node's pool '{node_a}', not in pool '{node_b}'" in refusal(
        lambda: driver.delete(ResourceSlice, odd.metadata.name))

    theirs: Any = admin.create(slice_for(node_b))
    admin_slices.append(theirs.metadata.name)
    assert "may only change ResourceSlices of its own node" in refusal(
        lambda: driver.delete(ResourceSlice, theirs.metadata.name)
    )
    # reading (with the list the driver uses; it has no single get) is fine
    theirs_read: Any = next(s for s in driver.list(ResourceSlice, fields={"spec.nodeName": node_b})
                            if s.metadata.name == theirs.metadata.name)
    theirs_read.metadata.labels = {"taken": "yes"}
    message = refusal(lambda: driver.replace(theirs_read))
    assert "of its own node" in message and f"node '{node_b}'" in message


def check_rbac(driver: Client, node_a: str) -> None:
    """What the driver may do besides slices: get one claim (by name: it may not list them) and its Node; nothing else
    (tests/e2e/test_efa_dra_e2e.py checks every verb it is denied)."""
    list(driver.list(ResourceSlice, fields={"spec.nodeName": node_a}))
    assert as_dict(driver.get(Node, node_a))["metadata"]["name"] == node_a
    refused: list[Callable[[], object]] = [
        lambda: list(driver.list(ResourceClaim, namespace="*")),
        lambda: driver.get(ResourceSlice, "anything"),
        lambda: list(driver.list(Secret, namespace=DRA_NS)),
        lambda: list(driver.list(Pod, namespace="*")),
        lambda: driver.get(DeviceClass, "neuron.aws.com"),
        lambda: driver.delete(DaemonSet, "neuron-dra-driver-kubelet-plugin", namespace=DRA_NS),
    ]
    for action in refused:
        with pytest.raises(ApiError) as err:
            action()
        assert err.value.status.code == 403


def test_seed_device_plugin_install_then_npd(kube_client: Client, helm: Helm, fake_node: FakeNode, wait: Wait) -> None:
    trn = fake_node(labels={INSTANCE_TYPE: "trn1.32xlarge"})
    labelled = fake_node(labels={INSTANCE_TYPE: "trn9.48xlarge", "aws.amazon.com/neuron.present": "true"})
    plain = fake_node(labels={INSTANCE_TYPE: "m5.large"})
    with uninstalled_after(helm, "neuron-helm-chart", "default"):
        # No --namespace in the guide: the release lands in "default", the DaemonSet in kube-system.
        notes = helm.seed(SEED_DEVICE_PLUGIN_INSTALL, NEURON_CHART)
        assert "kubectl get ds -n kube-system neuron-device-plugin" in notes
        docs = helm.manifest("neuron-helm-chart", "default")
        assert {(d["kind"], d["metadata"]["name"]) for d in docs} == {
            ("ServiceAccount", "neuron-device-plugin"),
            ("ClusterRole", "neuron-device-plugin"),  # its own Node's UltraServer labels and device-usage only
            ("ClusterRoleBinding", "neuron-device-plugin"),
            ("ValidatingAdmissionPolicy", "neuron-own-node-keys.default.neuron-helm-chart"),
            ("ValidatingAdmissionPolicyBinding", "neuron-own-node-keys.default.neuron-helm-chart"),
            ("Service", "neuron-device-plugin-metrics"),
            ("DaemonSet", "neuron-device-plugin"),
        }
        assert_all_present(kube_client, docs)
        kube_client.get(DaemonSet, "neuron-device-plugin", namespace="kube-system")
        selector = {"name": "neuron-device-plugin-ds"}
        pods = wait(
            lambda: (p := daemonset_pods(kube_client, "kube-system", selector)) and {trn, labelled} <= p.keys() and p,
            "device plugin pods on the listed type and on the labelled node",
        )
        assert plain not in pods

        # Turning node problem detection on (the chart's default) creates its namespace and objects.
        helm("upgrade", "neuron-helm-chart", str(NEURON_CHART), "--namespace", "default", "--reuse-values",
             "--set", "npd.enabled=true")  # fmt: skip
        docs = helm.manifest("neuron-helm-chart", "default")
        assert ("Namespace", NPD_NS) in {(d["kind"], d["metadata"]["name"]) for d in docs}
        assert_all_present(kube_client, docs)
        config = as_dict(kube_client.get(ConfigMap, "neuron-node-problem-detector-config", namespace=NPD_NS))
        assert "NEURON_HW_ERR=DMA_ERROR" in config["data"]["neuron-kernel-monitor.json"]
        npd_pods = wait(
            lambda: (p := daemonset_pods(kube_client, NPD_NS,
                                         {"app.kubernetes.io/name": "neuron-node-problem-detector"}))
            and trn in p and p,
            "node-problem-detector pods on the Neuron nodes",
        )  # fmt: skip
        assert plain not in npd_pods
    # (Its pods stay Terminating: no kubelet confirms their end. The node deletion lets the pod GC remove them.)
    assert "neuron-device-plugin" not in {
        as_dict(d)["metadata"]["name"] for d in kube_client.list(DaemonSet, namespace="kube-system")
    }


def test_install_with_my_scheduler(kube_client: Client, helm: Helm, wait: Wait) -> None:
    """scheduler.enabled: the API server accepts every object (RBAC role references, the Deployments, the
    scheduler configuration, the TLS Secrets, the NetworkPolicy), and they are all there; an upgrade keeps the
    chart-made certificates (helm lookup), so both sides keep trusting each other."""
    flags = ("--namespace", "default", "--set", "npd.enabled=false", "--set", "devicePlugin.enabled=false",
             "--set", "scheduler.enabled=true")  # fmt: skip
    secrets = ("neuron-scheduler-extender-tls", "my-scheduler-extender-client-tls")
    with uninstalled_after(helm, "neuron-sched", "default"):
        helm("install", "neuron-sched", str(NEURON_CHART), *flags)
        docs = helm.manifest("neuron-sched", "default")
        names = {(d["kind"], d["metadata"]["name"]) for d in docs}
        assert {("Deployment", "my-scheduler"), ("Deployment", "neuron-scheduler-extender"),
                ("Service", "neuron-scheduler-extender"), ("ConfigMap", "my-scheduler-config"),
                ("ClusterRole", "neuron-scheduler-extender"), ("NetworkPolicy", "neuron-scheduler-extender"),
                *(("Secret", s) for s in secrets)} <= names
        assert_all_present(kube_client, docs)
        before = {s: as_dict(kube_client.get(Secret, s, namespace="kube-system"))["data"] for s in secrets}
        helm("upgrade", "neuron-sched", str(NEURON_CHART), *flags)
        after = {s: as_dict(kube_client.get(Secret, s, namespace="kube-system"))["data"] for s in secrets}
        assert after == before
        assert before[secrets[0]]["ca.crt"] == before[secrets[1]]["ca.crt"]


def test_efa_install_selects_pods_by_the_documented_label(
    kube_client: Client, helm: Helm, fake_node: FakeNode, wait: Wait
) -> None:
    p5 = fake_node(labels={INSTANCE_TYPE: "p5.48xlarge"})
    labelled = fake_node(labels={INSTANCE_TYPE: "p9.48xlarge", "vpc.amazonaws.com/efa.present": "true"})
    plain = fake_node(labels={INSTANCE_TYPE: "c5.large"})
    auto = fake_node(labels={INSTANCE_TYPE: "p5.48xlarge", "eks.amazonaws.com/compute-type": "auto"})
    with uninstalled_after(helm, "aws-efa-k8s-device-plugin", "kube-system"):
        helm("upgrade", "--install", "aws-efa-k8s-device-plugin", str(EFA_CHART), "--namespace", "kube-system")
        docs = helm.manifest("aws-efa-k8s-device-plugin", "kube-system")
        assert_all_present(kube_client, docs)
        # kubectl get daemonsets -n kube-system / kubectl get pods -n kube-system -l name=aws-efa-k8s-device-plugin
        ds = kube_client.get(DaemonSet, "aws-efa-k8s-device-plugin-daemonset", namespace="kube-system")
        assert as_dict(ds)["spec"]["template"]["spec"]["priorityClassName"] == "system-node-critical"
        pods = wait(
            lambda: (
                (p := daemonset_pods(kube_client, "kube-system", {"name": "aws-efa-k8s-device-plugin"}))
                and {p5, labelled} <= p.keys()
                and p
            ),
            "EFA plugin pods on the p5 node and on the labelled node",
        )
        assert plain not in pods and auto not in pods
