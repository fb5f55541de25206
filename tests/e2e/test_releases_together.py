"""Several releases of the charts in one cluster (issue 31 item 2), with the real helm and the real API server.

The Neuron guide installs the chart twice under one release name: the DRA driver in ``neuron-dra-driver`` and the
device plugin in ``default``. Both must install, and every daemon's service account must stay limited to its own
Node's owned keys (the chart's own-node policy) while the other release is upgraded or uninstalled. The same for
issue 31's two EFA releases in kube-system (the EFA DRA driver's slices stay limited to its own node).

A daemon's credentials are minted as the kubelet mints them: a TokenRequest bound to the daemon's Pod, which the API
server fills with the Pod's node name. The DaemonSet pods sit on fake Nodes (no kubelet; kube-scheduler binds them).
The issue's own check, ``kubectl --as=system:serviceaccount:NS:SA label node ...``, is run as well: without the
node-name extra, and with it impersonated too (what a pod-bound token carries).
"""

from __future__ import annotations

import contextlib
import json
import subprocess
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from accel_rig.controlplane import ControlPlane
from chart_render import EFA_CHART, NEURON_CHART, SEED_DEVICE_PLUGIN_INSTALL, SEED_DRA_INSTALL
from lightkube import ApiError, Client, KubeConfig
from lightkube.resources.admissionregistration_v1 import ValidatingAdmissionPolicy
from lightkube.resources.apps_v1 import DaemonSet
from lightkube.resources.core_v1 import Node, Pod
from lightkube.resources.resource_v1 import ResourceSlice
from runtime_helpers import Helm
from test_charts_install import absent, remove_namespace, slice_for

Wait = Callable[..., Any]
INSTANCE_TYPE = "node.kubernetes.io/instance-type"
NODE_NAME_EXTRA = "authentication.kubernetes.io/node-name"
#: A label and an annotation the Neuron daemons own (charts/neuron-helm-chart/templates/_helpers.tpl).
OWNED_LABEL = "neuron.amazonaws.com/ultraserver-mode"
OWNED_ANNOTATION = "neuron.amazonaws.com/device-usage"


@dataclass(frozen=True)
class Daemon:
    """One release's daemon: where its pods run, its account and its pods' selector."""

    release: str
    release_ns: str
    namespace: str
    account: str
    daemonset: str
    selector: Mapping[str, str]

    @property
    def user(self) -> str:
        return f"system:serviceaccount:{self.namespace}:{self.account}"

    @property
    def policy(self) -> str:
        """The own-node policy of its release (named per release)."""
        return f"neuron-own-node-keys.{self.release_ns}.{self.release}"


NEURON_DRA = Daemon("neuron-helm-chart", "neuron-dra-driver", "neuron-dra-driver", "neuron-dra-driver-sa",
                    "neuron-dra-driver-kubelet-plugin", {"app.kubernetes.io/name": "neuron-dra-driver"})
NEURON_DP = Daemon("neuron-helm-chart", "default", "kube-system", "neuron-device-plugin", "neuron-device-plugin",
                   {"name": "neuron-device-plugin-ds"})
EFA_DRA = Daemon("efa-dra", "kube-system", "kube-system", "aws-efa-k8s-device-plugin-dra-driver",
                 "aws-efa-k8s-device-plugin-dra-driver", {"name": "aws-efa-k8s-device-plugin-dra-driver"})


class Kubectl:
    """The cluster's kubectl with a kubeconfig; returns (exit code, stdout + stderr)."""

    def __init__(self, binary: Path, kubeconfig: Path) -> None:
        self.binary, self.kubeconfig = binary, kubeconfig

    def __call__(self, *args: str) -> tuple[int, str]:
        proc = subprocess.run([str(self.binary), "--kubeconfig", str(self.kubeconfig), *args],
                              capture_output=True, text=True, timeout=60, check=False)
        return proc.returncode, proc.stdout + proc.stderr


def impersonating(control_plane: ControlPlane, tmp_path: Path, user: str, node: str | None) -> Kubectl:
    """kubectl as the admin impersonating ``user`` (``--as``), with the node-name extra a pod-bound token carries
    when ``node`` is given (kubeconfig ``as-user-extra``; kubectl has no flag for it)."""
    config = yaml.safe_load(control_plane.admin_kubeconfig.read_text())
    for entry in config["users"]:
        entry["user"]["as"] = user
        if node:
            entry["user"]["as-user-extra"] = {NODE_NAME_EXTRA: [node]}
    path = tmp_path / f"as-{user.replace(':', '_')}-{node or 'nonode'}.kubeconfig"
    path.write_text(yaml.safe_dump(config))
    return Kubectl(control_plane.kubectl, path)


def live_pods(kube: Client, daemon: Daemon, wait: Wait) -> dict[str, str]:
    """node -> a pod of the daemon's current template, bound by the scheduler (the DaemonSet controller will not
    delete it, so a token bound to it stays valid). Pods an upgrade or uninstall deleted stay Terminating without a
    kubelet; they are force-deleted so the controller makes their successors."""

    def current() -> dict[str, str] | None:
        ds: Any = kube.get(DaemonSet, daemon.daemonset, namespace=daemon.namespace)
        generation = ds.metadata.generation
        if (ds.status.observedGeneration if ds.status else None) != generation:
            return None
        pods: dict[str, str] = {}
        for pod in kube.list(Pod, namespace=daemon.namespace, labels=dict(daemon.selector)):
            meta: Any = pod.metadata
            if meta.deletionTimestamp:
                with contextlib.suppress(ApiError):
                    kube.delete(Pod, meta.name, namespace=daemon.namespace, grace_period=0)
            elif (meta.labels or {}).get("pod-template-generation") == str(generation) and pod.spec and \
                    pod.spec.nodeName:
                pods[pod.spec.nodeName] = meta.name
        return pods or None

    result: dict[str, str] = wait(current, f"{daemon.user}'s pods of the current template bound to their nodes")
    return result


def refused(kubectl: Kubectl, *args: str) -> str:
    code, out = kubectl(*args)
    assert code != 0, f"kubectl {' '.join(args)} was allowed:\n{out}"
    return out


def allowed(kubectl: Kubectl, *args: str) -> None:
    code, out = kubectl(*args)
    assert code == 0, f"kubectl {' '.join(args)} was refused:\n{out}"


def check_own_node_only(control_plane: ControlPlane, kube: Client, daemon: Daemon, nodes: list[str],
                        tmp_path: Path, wait: Wait) -> None:
    """With a token bound to its pod on one node, the daemon's account may change that Node's owned keys and
    nothing else; the refusal comes from its own release's policy. Then the same with ``kubectl --as``."""
    pods = live_pods(kube, daemon, wait)
    node = sorted(pods)[0]
    other = next(n for n in nodes if n != node)
    token = control_plane.mint_token(daemon.namespace, daemon.account, bound_pod=pods[node])
    as_pod = Kubectl(control_plane.kubectl, control_plane.kubeconfig_for_token(token))

    # The API server loads a new policy a moment after it is created; until then RBAC alone would allow this.
    def evil_refused() -> str | None:
        code, out = as_pod("label", "node", node, "evil=2", "--overwrite")
        if code == 0:
            kube.patch(Node, node, {"metadata": {"labels": {"evil": None}}})
            return None
        return out

    out = wait(evil_refused, f"the own-node policy to refuse {daemon.user} an unowned label")
    assert f"ValidatingAdmissionPolicy '{daemon.policy}'" in out and "not evil" in out, out
    allowed(as_pod, "label", "node", node, f"{OWNED_LABEL}=4", "--overwrite")
    allowed(as_pod, "annotate", "node", node, f'{OWNED_ANNOTATION}={{"v":1}}', "--overwrite")
    allowed(as_pod, "label", "node", node, f"{OWNED_LABEL}-")
    allowed(as_pod, "annotate", "node", node, f"{OWNED_ANNOTATION}-")
    out = refused(as_pod, "label", "node", other, f"{OWNED_LABEL}=4", "--overwrite")
    assert f"may only change its own Node, not '{other}'" in out, out
    assert "not evil" in refused(as_pod, "annotate", "node", node, "evil=2")
    assert "may not change its Node's spec" in refused(as_pod, "taint", "node", node, "evil=2:NoSchedule")

    # The command: impersonating the account names no node, so nothing passes.
    bare = impersonating(control_plane, tmp_path, daemon.user, None)
    out = refused(bare, "label", "node", node, "evil=2")
    assert "credentials name no node" in out and daemon.policy in out, out
    assert "credentials name no node" in refused(bare, "label", "node", node, f"{OWNED_LABEL}=4")
    as_node = impersonating(control_plane, tmp_path, daemon.user, node)
    allowed(as_node, "label", "node", node, f"{OWNED_LABEL}=2", "--overwrite")
    allowed(as_node, "label", "node", node, f"{OWNED_LABEL}-")
    assert "not evil" in refused(as_node, "label", "node", node, "evil=2")
    assert f"not '{other}'" in refused(as_node, "label", "node", other, f"{OWNED_LABEL}=2", "--overwrite")
    meta: Any = kube.get(Node, node).metadata
    labels = meta.labels or {}
    assert "evil" not in labels and OWNED_LABEL not in labels


def snapshot(admin: Kubectl, docs: list[dict[str, Any]], tmp_path: Path) -> dict[tuple[str, str, str], Any]:
    """(kind, namespace, name) -> each object of a release manifest as stored (``kubectl get -f``), without what
    controllers keep changing (status, resourceVersion, managedFields); the uid shows it was not made again."""
    path = tmp_path / "manifest.yaml"
    path.write_text(yaml.safe_dump_all(docs))
    code, out = admin("get", "-f", str(path), "-o", "json")
    assert code == 0, out
    items = json.loads(out)["items"]
    assert len(items) == len(docs), out
    stored = {}
    for item in items:
        item.pop("status", None)
        for key in ("resourceVersion", "managedFields"):
            item["metadata"].pop(key, None)
        stored[(item["kind"], item["metadata"].get("namespace", ""), item["metadata"]["name"])] = item
    return stored


@pytest.fixture
def helm(control_plane: ControlPlane, tmp_path: Path) -> Helm:
    return Helm(control_plane, tmp_path / "helm")


def test_both_neuron_seed_installs_keep_each_daemon_on_its_own_node(
    control_plane: ControlPlane, kube_client: Client, helm: Helm, fake_node: Callable[..., str], wait: Wait,
    tmp_path: Path,
) -> None:
    nodes = [fake_node(labels={INSTANCE_TYPE: "trn2.48xlarge"}) for _ in range(2)]
    admin = Kubectl(control_plane.kubectl, control_plane.admin_kubeconfig)
    installed: list[Daemon] = []

    def check(*daemons: Daemon) -> None:
        for daemon in daemons:
            check_own_node_only(control_plane, kube_client, daemon, nodes, tmp_path, wait)

    def manifest(daemon: Daemon) -> list[dict[str, Any]]:
        return helm.manifest(daemon.release, daemon.release_ns)

    try:
        helm.seed(SEED_DRA_INSTALL, NEURON_CHART)
        installed.append(NEURON_DRA)
        helm.seed(SEED_DEVICE_PLUGIN_INSTALL, NEURON_CHART)  # failed before: the own-node policy was shared
        installed.append(NEURON_DP)
        for daemon in (NEURON_DRA, NEURON_DP):
            policy: Any = kube_client.get(ValidatingAdmissionPolicy, daemon.policy)
            assert policy.metadata.annotations["meta.helm.sh/release-namespace"] == daemon.release_ns
        check(NEURON_DRA, NEURON_DP)

        # Upgrading one release leaves every object of the other as it was, and both restrictions hold.
        for changed, kept, flag in [(NEURON_DP, NEURON_DRA, "logLevel=DEBUG"),
                                    (NEURON_DRA, NEURON_DP, "draDriver.extendedResource=true")]:
            before = snapshot(admin, manifest(kept), tmp_path)
            helm("upgrade", changed.release, str(NEURON_CHART), "--namespace", changed.release_ns, "--reuse-values",
                 "--set", flag)
            assert snapshot(admin, manifest(kept), tmp_path) == before
            check(NEURON_DRA, NEURON_DP)

        # Uninstalling one does too; the uninstalled account may no longer touch Nodes at all.
        for gone, kept, seed in [(NEURON_DP, NEURON_DRA, SEED_DEVICE_PLUGIN_INSTALL),
                                 (NEURON_DRA, NEURON_DP, SEED_DRA_INSTALL)]:
            before = snapshot(admin, manifest(kept), tmp_path)
            helm("uninstall", gone.release, "--namespace", gone.release_ns)
            installed.remove(gone)
            assert absent(kube_client, ValidatingAdmissionPolicy, gone.policy)
            assert snapshot(admin, manifest(kept), tmp_path) == before
            check(kept)
            out = refused(impersonating(control_plane, tmp_path, gone.user, nodes[0]),
                          "label", "node", nodes[0], f"{OWNED_LABEL}=4")
            assert "Forbidden" in out or "forbidden" in out, out
            if gone is NEURON_DP:  # and back, so the DRA release is the one uninstalled next
                helm.seed(seed, NEURON_CHART)
                installed.append(gone)
                check(NEURON_DRA, NEURON_DP)
    finally:
        for daemon in installed:
            with contextlib.suppress(AssertionError):
                helm("uninstall", daemon.release, "--namespace", daemon.release_ns)
        remove_namespace(kube_client, NEURON_DRA.namespace, wait)


def check_efa_slices(control_plane: ControlPlane, kube: Client, nodes: list[str], tmp_path: Path, wait: Wait) -> None:
    """The EFA DRA driver's pod-bound token writes slices of its own node only (its release's slice policy); so does
    ``kubectl --as`` the driver's account with the node-name extra, and without it nothing passes."""
    pods = live_pods(kube, EFA_DRA, wait)
    node = sorted(pods)[0]
    other = next(n for n in nodes if n != node)
    token = control_plane.mint_token(EFA_DRA.namespace, EFA_DRA.account, bound_pod=pods[node])
    with Client(KubeConfig.from_file(control_plane.kubeconfig_for_token(token))) as driver:
        def refused_on_other() -> str | None:
            try:
                made: Any = driver.create(slice_for(other, driver="efa.aws.com"))
            except ApiError as e:
                return e.status.message if e.status.code in (403, 422) else None
            kube.delete(ResourceSlice, made.metadata.name)
            return None

        message = wait(refused_on_other, "the EFA slice policy to refuse another node's slice")
        assert "may only write ResourceSlices of its own node" in message and f"node '{other}'" in message
        own: Any = driver.create(slice_for(node, driver="efa.aws.com"))
        driver.delete(ResourceSlice, own.metadata.name)

    def slice_file(on: str) -> str:
        path = tmp_path / f"slice-{on}.yaml"
        path.write_text(yaml.safe_dump(slice_for(on, driver="efa.aws.com").to_dict()))
        return str(path)

    bare = impersonating(control_plane, tmp_path, EFA_DRA.user, None)
    assert "credentials name no node" in refused(bare, "create", "-f", slice_file(node))
    as_node = impersonating(control_plane, tmp_path, EFA_DRA.user, node)
    assert f"node '{other}'" in refused(as_node, "create", "-f", slice_file(other))
    code, out = as_node("create", "-f", slice_file(node), "-o", "name")
    assert code == 0, out
    allowed(as_node, "delete", out.strip())


def test_both_efa_releases_keep_the_dra_driver_on_its_own_node(
    control_plane: ControlPlane, kube_client: Client, helm: Helm, fake_node: Callable[..., str], wait: Wait,
    tmp_path: Path,
) -> None:
    nodes = [fake_node(labels={INSTANCE_TYPE: "p5.48xlarge"}) for _ in range(2)]
    admin = Kubectl(control_plane.kubectl, control_plane.admin_kubeconfig)
    efa = ("--namespace", "kube-system")
    try:
        helm("upgrade", "--install", "efa", str(EFA_CHART), *efa)
        helm("upgrade", "--install", "efa-dra", str(EFA_CHART), *efa, "--set", "devicePlugin.enabled=false",
             "--set", "draDriver.enabled=true")
        check_efa_slices(control_plane, kube_client, nodes, tmp_path, wait)
        before = snapshot(admin, helm.manifest("efa-dra", "kube-system"), tmp_path)
        helm("upgrade", "efa", str(EFA_CHART), *efa, "--reuse-values", "--set", "logLevel=DEBUG")
        assert snapshot(admin, helm.manifest("efa-dra", "kube-system"), tmp_path) == before
        helm("uninstall", "efa", *efa)
        assert snapshot(admin, helm.manifest("efa-dra", "kube-system"), tmp_path) == before
        check_efa_slices(control_plane, kube_client, nodes, tmp_path, wait)
    finally:
        for release in ("efa", "efa-dra"):
            with contextlib.suppress(AssertionError):
                helm("uninstall", release, *efa)
