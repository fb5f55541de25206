"""UltraServer (trn2u) end to end on the real control plane with fake UltraServer hosts (``fake-sysfs --ultraserver``).

- Node labels: the Neuron DRA driver and the Neuron device plugin, each with a token bound to a Pod of its chart
  ServiceAccount on its node, keep ``neuron.amazonaws.com/ultraserver-*`` right on their own Node as sysfs changes;
  the chart's RBAC and admission policy refuse any other Node, any other key and the Node's spec.
- Exclusion: on one node, a claim for a chip and a claim for the ``neuron_node`` device never both get allocated by
  kube-scheduler, whichever comes first.
- Placement: 8 nodes in 2 UltraServers; the 4-node example's pods land on the 4 nodes of one UltraServer, each claim
  gets its own node's ``neuron-node``, and prepare (kubelet stand-in) gives each pod its node id; the 2-node example
  then fills one 2-node set of the other UltraServer.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from accel_rig.controlplane import ControlPlane
from accel_rig.kubelet_standin import KubeletStandIn
from conftest import Daemon as ConftestDaemon
from conftest import RealNode
from dra_support import (
    NEURON,
    REPO,
    DriverKind,
    DriverProcess,
    allocated_claim,
    call_driver,
    chart_objects,
    make_pod,
    node_slices,
    pod_bound_kubeconfig,
    pod_node,
    results,
    wait_published,
)
from kube_helpers import pod_phase
from lightkube import ApiError, Client, KubeConfig, codecs
from lightkube.resources.core_v1 import Node, Pod
from lightkube.resources.resource_v1 import ResourceClaim
from lightkube.types import PatchType

from accel_core.fakehost import FakeHost, build_host
from neuron_dra.facts.ultraserver import fake_ids

Wait = Callable[..., Any]
FakeNode = Callable[..., str]

CHART = REPO / "charts" / "neuron-helm-chart"
DRA_FLAGS = ("--set", "devicePlugin.enabled=false", "--set", "draDriver.enabled=true", "--set", "npd.enabled=false")
DP_FLAGS = ("--set", "npd.enabled=false")
DEVICE_PLUGIN = DriverKind("neuron-device-plugin", "neuron_dra.deviceplugin.cli", "kube-system", "neuron-device-plugin")
TRN2U = "trn2u.48xlarge"
INSTANCE_TYPE = "node.kubernetes.io/instance-type"
EXAMPLES = REPO / "examples" / "neuron-dra" / "ultraserver"
PREFIX = "neuron.amazonaws.com/ultraserver-"
# neuron.md 1.3: ultraserver_mode lists runtime modes 1=X4 (4 nodes), 2=X2H, 3=X2V (2 nodes), 4=X1 (1 node);
# the label lists the set sizes as in the AWS document's example.
ALL_SIZES = "1_2_4"


def host_file(host: FakeHost, name: str) -> str:
    return (host.root / "sys/class/neuron_device" / name).read_text().strip()


def expected_labels(host: FakeHost) -> dict[str, str]:
    """What the class attribute files say, as the AWS document names the labels."""
    return {f"{PREFIX}mode": ALL_SIZES, f"{PREFIX}server-id-2": host_file(host, "server_id_2"),
            f"{PREFIX}node-id-2": host_file(host, "node_id_2"), f"{PREFIX}server-id-4": host_file(host, "server_id_4"),
            f"{PREFIX}node-id-4": host_file(host, "node_id_4")}


def ultraserver_labels(client: Client, node: str) -> dict[str, str]:
    meta: Any = client.get(Node, node).metadata
    return {k: v for k, v in (meta.labels or {}).items() if k.startswith(PREFIX)}


def refused(action: Callable[[], object]) -> str:
    with pytest.raises(ApiError) as err:
        action()
    assert err.value.status.code in (403, 422), err.value.status.message
    return str(err.value.status.message)


def check_own_node_only(admin: Client, daemon: Client, own: str, other: str, wait: Wait) -> None:
    owned = f"{PREFIX}mode"

    # The policy takes effect once the API server has loaded it; until then RBAC alone lets the patch through.
    def refused_on_other() -> str | None:
        try:
            daemon.patch(Node, other, {"metadata": {"labels": {owned: "4"}}}, patch_type=PatchType.MERGE)
        except ApiError as exc:
            return str(exc.status.message) if exc.status.code in (403, 422) else None
        admin.patch(Node, other, {"metadata": {"labels": {owned: None}}}, patch_type=PatchType.MERGE)
        return None

    message = wait(refused_on_other, "the own-node policy to refuse a patch of another Node")
    assert f"may only change its own Node, not '{other}'" in message
    message = refused(lambda: daemon.patch(Node, own, {"metadata": {"labels": {"team": "ml"}}},
                                           patch_type=PatchType.MERGE))
    assert "not team" in message
    message = refused(lambda: daemon.patch(Node, own, {"metadata": {"annotations": {"x.example.com/y": "1"}}},
                                           patch_type=PatchType.MERGE))
    assert "not x.example.com/y" in message
    message = refused(lambda: daemon.patch(Node, own, {"spec": {"unschedulable": True}}, patch_type=PatchType.MERGE))
    assert "may not change its Node's spec" in message


class Daemon(DriverProcess):
    """``neuron-device-plugin serve`` against a fake host (no kubelet: it keeps retrying registration)."""

    def start(self) -> None:
        env = {**os.environ, "PYTHONPATH": str(REPO), "NODE_NAME": self.node}
        env.pop("KUBECONFIG", None)
        with self.log.open("ab") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", self.kind.module, "serve", "--host-root", str(self.host_root),
                 "--kubelet-root", str(self.kubelet_root),
                 "--device-plugins-dir", str(self.kubelet_root / "device-plugins"),
                 "--kubeconfig", str(self.kubeconfig), "--metrics-port", "0"],
                env=env, stdout=log, stderr=subprocess.STDOUT)


def follows_sysfs(admin: Client, host: FakeHost, node: str, daemon: DriverProcess, wait: Wait) -> None:
    """The labels match the host, then follow an election (``busy``) and the node leaving its UltraServer."""
    want = expected_labels(host)
    try:
        wait(lambda: ultraserver_labels(admin, node) == want, f"the UltraServer labels on {node}", timeout=60)
    except (AssertionError, TimeoutError) as exc:  # the driver exited, or the wait timed out
        raise AssertionError(f"{exc}: {ultraserver_labels(admin, node)}\n{daemon.tail()}") from exc
    busy = dataclasses.replace(fake_ids("us-labels", 2), busy=True)
    host.set_ultraserver(busy)
    no_mode = {k: v for k, v in want.items() if k != f"{PREFIX}mode"}
    wait(lambda: ultraserver_labels(admin, node) == no_mode, "the mode label removed while ultraserver_mode is busy")
    host.set_ultraserver(None)  # the node left its UltraServer: node ids -1
    wait(lambda: ultraserver_labels(admin, node) == {}, "every UltraServer label removed")


@pytest.mark.timeout(600)
def test_dra_driver_labels_its_own_node_only(control_plane: ControlPlane, kube_client: Client, fake_node: FakeNode,
                                              short_tmp: Path, wait: Wait) -> None:
    own = fake_node(labels={INSTANCE_TYPE: TRN2U})
    other = fake_node(labels={INSTANCE_TYPE: TRN2U})
    with chart_objects(control_plane, kube_client, CHART, DRA_FLAGS):
        host = build_host(short_tmp / "dra" / "host", TRN2U, ultraserver_id="us-labels", ultraserver_node=2)
        kubeconfig = pod_bound_kubeconfig(control_plane, kube_client, NEURON, own, wait)
        driver = DriverProcess(NEURON, short_tmp / "dra", own, kubeconfig)
        driver.start()
        try:
            # 16 chips and the node device; the counters slice went through the API server unchanged
            slices = wait_published(kube_client, driver, 17, wait)
            counters = [s["spec"]["sharedCounters"] for s in slices if s["spec"].get("sharedCounters")]
            assert counters == [[{"name": "neuron-chips", "counters": {"chips": {"value": "16"}}}]]
            node_dev = next(d for s in slices for d in s["spec"].get("devices") or [] if d["name"] == "neuron-node")
            assert node_dev["attributes"]["resourceType"] == {"string": "neuron_node"}
            assert node_dev["attributes"]["nodeId4"] == {"int": 2}
            assert node_dev["consumesCounters"] == [{"counterSet": "neuron-chips",
                                                     "counters": {"chips": {"value": "16"}}}]
            with Client(KubeConfig.from_file(kubeconfig), field_manager="e2e-probe") as daemon:
                check_own_node_only(kube_client, daemon, own, other, wait)
            follows_sysfs(kube_client, host, own, driver, wait)
        finally:
            driver.stop()
            with contextlib.suppress(ApiError):
                kube_client.delete(Pod, f"neuron-driver-{own}"[:63], namespace=NEURON.namespace, grace_period=0)


@pytest.mark.timeout(600)
def test_device_plugin_labels_its_own_node_only(control_plane: ControlPlane, kube_client: Client,
                                                fake_node: FakeNode, short_tmp: Path, wait: Wait) -> None:
    own = fake_node(labels={INSTANCE_TYPE: TRN2U})
    other = fake_node(labels={INSTANCE_TYPE: TRN2U})
    pod = f"neuron-device-plugin-driver-{own}"[:63]
    with chart_objects(control_plane, kube_client, CHART, DP_FLAGS):
        host = build_host(short_tmp / "dp" / "host", TRN2U, ultraserver_id="us-labels", ultraserver_node=2)
        kubeconfig = pod_bound_kubeconfig(control_plane, kube_client, DEVICE_PLUGIN, own, wait)
        plugin = Daemon(DEVICE_PLUGIN, short_tmp / "dp", own, kubeconfig)
        plugin.start()
        try:
            with Client(KubeConfig.from_file(kubeconfig), field_manager="e2e-probe") as daemon:
                check_own_node_only(kube_client, daemon, own, other, wait)
            follows_sysfs(kube_client, host, own, plugin, wait)
        finally:
            plugin.stop()
            with contextlib.suppress(ApiError):
                kube_client.delete(Pod, pod, namespace=DEVICE_PLUGIN.namespace, grace_period=0)


# -- scheduling ------------------------------------------------------------------------------------------------------
@dataclasses.dataclass
class UsNode:
    """One trn2u node: node ``index`` of UltraServer ``ultraserver``; a real kubelet (``real``) or a fake Node whose
    driver the kubelet stand-in calls (``driver``)."""

    name: str
    host: FakeHost
    ultraserver: str
    index: int
    driver: DriverProcess | None = None
    real: RealNode | None = None


@pytest.fixture
def ultraservers(control_plane: ControlPlane, kube_client: Client, fake_node: FakeNode, short_tmp: Path,
                 kubelet_node: Callable[..., RealNode], daemon: Callable[..., ConftestDaemon],
                 wait: Wait) -> Iterator[list[UsNode]]:
    """8 trn2u nodes, nodes 0..3 of UltraServers ``us-a`` and ``us-b``, each with its DRA driver publishing. Node 0 of
    each UltraServer is a real kubelet (so the 4-node workload always has one); the rest use the stand-in."""
    nodes: list[UsNode] = []
    with chart_objects(control_plane, kube_client, CHART, DRA_FLAGS):
        try:
            for us in ("us-a", "us-b"):
                real = kubelet_node(TRN2U)
                real.host.set_ultraserver(fake_ids(us, 0))
                daemon("neuron-dra-driver", "serve", "--metrics-port", "0", "--healthcheck-port", "-1",
                       "--rescan-interval", "1", env=real.env(POD_UID=f"dra-{us}"))
                nodes.append(UsNode(real.name, real.host, us, 0, real=real))
                for k in range(1, 4):
                    name = fake_node(labels={INSTANCE_TYPE: TRN2U})
                    root = short_tmp / f"{us}-{k}"
                    host = build_host(root / "host", TRN2U, ultraserver_id=us, ultraserver_node=k)
                    driver = DriverProcess(NEURON, root, name,
                                           pod_bound_kubeconfig(control_plane, kube_client, NEURON, name, wait))
                    driver.start()
                    nodes.append(UsNode(name, host, us, k, driver=driver))
            for n in nodes:
                if n.driver is not None:
                    wait_published(kube_client, n.driver, 17, wait)
                else:
                    wait(lambda n=n: sum(len(s["spec"].get("devices") or [])
                                         for s in node_slices(kube_client, n.name, NEURON.driver)) == 17,
                         f"17 devices published for the real kubelet node {n.name}")
                wait(lambda n=n: ultraserver_labels(kube_client, n.name) == expected_labels(n.host),
                     f"UltraServer labels on {n.name}")
            yield nodes
        finally:
            for n in nodes:
                if n.driver is not None and n.driver.running():
                    n.driver.stop()
                with contextlib.suppress(ApiError):
                    kube_client.delete(Pod, f"neuron-driver-{n.name}"[:63], namespace=NEURON.namespace,
                                       grace_period=0)


def apply_example(client: Client, namespace: str, name: str) -> list[str]:
    """Create an example's objects in ``namespace``; returns its StatefulSet's pod names."""
    pods: list[str] = []
    for doc in yaml.safe_load_all((EXAMPLES / name).read_text()):
        client.create(codecs.from_dict(doc), namespace=namespace)  # type: ignore[type-var]
        if doc["kind"] == "StatefulSet":
            pods += [f"{doc['metadata']['name']}-{i}" for i in range(doc["spec"]["replicas"])]
    return pods


def cdi_env(driver: DriverProcess, claim: dict[str, Any]) -> dict[str, str]:
    spec = driver.cdi_spec(claim["metadata"]["uid"])
    assert spec is not None, f"no CDI spec for {claim['metadata']['name']}"
    return dict(e.split("=", 1) for d in spec["devices"] for e in d["containerEdits"].get("env", []))


def placed(client: Client, namespace: str, pods: list[str], by_name: dict[str, UsNode], wait: Wait,
           ) -> dict[str, UsNode]:
    def check() -> dict[str, UsNode] | None:
        where = {p: pod_node(client, namespace, p) for p in pods}
        return {p: by_name[n] for p, n in where.items() if n} if all(where.values()) else None

    found: dict[str, UsNode] = wait(check, f"kube-scheduler to place {', '.join(pods)}", timeout=120)
    return found


def container_edits(cdi_root: Path, names: tuple[str, ...]) -> tuple[list[str], dict[str, str]]:
    """(device nodes, env) the runtime applies for the CDI device names the kubelet gave a container."""
    specs = [json.loads(p.read_text()) for p in cdi_root.glob("*.json")]
    nodes: list[str] = []
    env: dict[str, str] = {}
    for qualified in names:
        kind, _, dev = qualified.partition("=")
        (match,) = [d for s in specs if s["kind"] == kind for d in s["devices"] if d["name"] == dev]
        nodes += [n["path"] for n in match["containerEdits"].get("deviceNodes", [])]
        env.update(e.split("=", 1) for e in match["containerEdits"].get("env", []))
    return nodes, env


def prepare_on_nodes(client: Client, namespace: str, where: dict[str, UsNode], wait: Wait,
                     ) -> dict[str, dict[str, str]]:
    """Each pod's claim: allocated on its own node's neuron-node device and prepared there (by the real kubelet,
    which then starts the container, or through the stand-in); returns what each pod's container gets."""
    envs = {}
    for pod, n in where.items():
        claim = allocated_claim(client, namespace, wait, pod=pod)
        assert {(r["pool"], r["device"]) for r in claim["status"]["allocation"]["devices"]["results"]} == {
            (n.name, "neuron-node")}
        if n.real is not None:
            real = n.real
            wait(lambda p=pod: pod_phase(client, namespace, p) == "Running", f"{pod} Running on {n.name}",
                 timeout=120)
            (ctr,) = real.kubelet.containers(pod, namespace)
            devices, envs[pod] = container_edits(real.kubelet.layout.cdi_root, ctr.cdi_devices)
        else:
            assert n.driver is not None
            resp = call_driver(KubeletStandIn(n.driver.kubelet_root), NEURON.driver, claim)
            entry = resp[claim["metadata"]["uid"]]
            assert entry.error == "", entry.error
            spec = n.driver.cdi_spec(claim["metadata"]["uid"])
            assert spec is not None
            devices = [p["path"] for d in spec["devices"] for p in d["containerEdits"].get("deviceNodes", [])]
            envs[pod] = cdi_env(n.driver, claim)
        assert sorted(devices) == sorted(f"/dev/neuron{i}" for i in range(16))  # trn2u: 16 chips per node
    return envs


@pytest.mark.timeout(1200)
def test_ultraserver_workloads_land_in_one_set(kube_client: Client, ultraservers: list[UsNode], namespace: str,
                                                wait: Wait) -> None:
    by_name = {n.name: n for n in ultraservers}
    pods4 = apply_example(kube_client, namespace, "4-node-ultraserver.yaml")
    where4 = placed(kube_client, namespace, pods4, by_name, wait)
    chosen = {n.ultraserver for n in where4.values()}
    assert len(chosen) == 1, f"the 4 pods span UltraServers: {where4}"
    assert any(n.real is not None for n in where4.values()), "node 0 of each UltraServer runs a real kubelet"
    assert sorted(n.index for n in where4.values()) == [0, 1, 2, 3]
    envs = prepare_on_nodes(kube_client, namespace, where4, wait)
    for pod, n in where4.items():
        assert envs[pod]["NEURON_RT_ULTRASERVER_MODE"] == "1"  # X4 (neuron.md 1.3 enum)
        assert envs[pod]["NEURON_RT_ULTRASERVER_SERVER_ID"] == host_file(n.host, "server_id_4")
        assert envs[pod]["NEURON_RT_ULTRASERVER_NODE_ID"] == str(n.index)
        assert envs[pod]["NEURON_GLOBAL_TOPOID"] == str(n.index)
        assert envs[pod]["NEURON_RT_VISIBLE_CORES"] == "0-63"  # 16 chips x 4 logical cores (LNC 2)

    pods2 = apply_example(kube_client, namespace, "2-node-ultraserver.yaml")
    where2 = placed(kube_client, namespace, pods2, by_name, wait)
    pair = sorted(where2.values(), key=lambda n: n.index)
    assert {n.ultraserver for n in pair} == {"us-a", "us-b"} - chosen, f"not the free UltraServer: {where2}"
    assert [n.index // 2 for n in pair] in ([0, 0], [1, 1]), f"not one 2-node set: {where2}"
    envs = prepare_on_nodes(kube_client, namespace, where2, wait)
    assert {envs[p]["NEURON_RT_ULTRASERVER_NODE_ID"] for p in pods2} == {"0", "1"}
    for pod, n in where2.items():
        assert envs[pod]["NEURON_RT_ULTRASERVER_MODE"] == "2"  # X2H
        assert envs[pod]["NEURON_RT_ULTRASERVER_SERVER_ID"] == host_file(n.host, "server_id_2")
        assert envs[pod]["NEURON_RT_ULTRASERVER_NODE_ID"] == host_file(n.host, "node_id_2")


def claim_template(name: str, resource_type: str) -> dict[str, Any]:
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate", "metadata": {"name": name},
            "spec": {"spec": {"devices": {"requests": [{"name": "devices", "exactly": {
                "deviceClassName": NEURON.driver, "count": 1,
                "selectors": [{"cel": {"expression":
                                       f"device.attributes['{NEURON.driver}'].resourceType == '{resource_type}'"}}],
            }}]}}}}


def unschedulable(client: Client, namespace: str, pod: str) -> str | None:
    """The scheduler's message once it has found no node for ``pod``."""
    status = client.get(Pod, pod, namespace=namespace).status
    for cond in (status.conditions or []) if status is not None else []:
        if cond.type == "PodScheduled" and cond.status == "False" and cond.reason == "Unschedulable":
            return cond.message or "unschedulable"
    return None


@pytest.mark.timeout(900)
@pytest.mark.parametrize("first", ["neuron_device", "neuron_node"])
def test_chip_and_node_claims_exclude_each_other(kube_client: Client, fake_node: FakeNode, namespace: str,
                                                 control_plane: ControlPlane, short_tmp: Path, wait: Wait,
                                                 first: str) -> None:
    second = "neuron_node" if first == "neuron_device" else "neuron_device"
    with chart_objects(control_plane, kube_client, CHART, DRA_FLAGS):
        node = fake_node(labels={INSTANCE_TYPE: TRN2U})
        build_host(short_tmp / "x" / "host", TRN2U, ultraserver_id="us-x", ultraserver_node=0)
        driver = DriverProcess(NEURON, short_tmp / "x", node,
                               pod_bound_kubeconfig(control_plane, kube_client, NEURON, node, wait))
        driver.start()
        try:
            wait_published(kube_client, driver, 17, wait)
            for kind in (first, second):
                kube_client.create(codecs.from_dict(claim_template(kind.replace("_", "-"), kind)),  # type: ignore
                                   namespace=namespace)
            make_pod(kube_client, namespace, "first", template=first.replace("_", "-"), node=node)
            claim = allocated_claim(kube_client, namespace, wait, pod="first")
            got = results(claim, NEURON.driver)
            if first == "neuron_node":
                assert got == ["neuron-node"]
            else:
                assert len(got) == 1 and got[0].startswith("neuron-device-")
            make_pod(kube_client, namespace, "second", template=second.replace("_", "-"), node=node)
            message = wait(lambda: unschedulable(kube_client, namespace, "second"),
                           f"kube-scheduler to refuse a {second} claim beside the {first} one")
            assert "cannot allocate all claims" in message, message
            name = str(kube_client.get(Pod, "second", namespace=namespace).to_dict()["status"].get(
                "resourceClaimStatuses", [{}])[0].get("resourceClaimName", ""))
            if name:
                assert not kube_client.get(ResourceClaim, name, namespace=namespace).to_dict()["status"].get(
                    "allocation")
            # the first claim gone, the second fits
            kube_client.delete(Pod, "first", namespace=namespace, grace_period=0)
            with contextlib.suppress(ApiError):
                kube_client.delete(ResourceClaim, claim["metadata"]["name"], namespace=namespace)
            wait(lambda: pod_node(kube_client, namespace, "second") == node, "the second pod placed once freed",
                 timeout=120)
        finally:
            driver.stop()
            with contextlib.suppress(ApiError):
                kube_client.delete(Pod, f"neuron-driver-{node}"[:63], namespace=NEURON.namespace, grace_period=0)

