"""``neuron-dra-driver explain`` against kube-scheduler 1.37 on the same objects.

Three fake nodes (two trn2.48xlarge, one trn1.32xlarge), each with a real ``neuron-dra-driver serve`` and
``efa-dra-driver serve`` publishing their slices with the charts' credentials. For the seed's templates (Neuron, and
Neuron with their EFAs) and for claims that pend (5 connected devices, a selector matching nothing, 17 devices,
devices another claim holds), explain's verdict for each node is compared with what the scheduler does with one pod
per node pinned there by nodeSelector: scheduled exactly where explain says "fits", Unschedulable everywhere else;
and the pending pod's explanation names the cause.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from accel_rig.controlplane import ControlPlane
from dra_support import (
    EFA,
    NEURON,
    REPO,
    DriverProcess,
    chart_objects,
    make_pod,
    pod_bound_kubeconfig,
    pod_claim_name,
    wait_published,
)
from lightkube import ApiError, Client
from lightkube.resources.core_v1 import Pod, ServiceAccount
from lightkube.resources.rbac_authorization_v1 import ClusterRole, ClusterRoleBinding, Role, RoleBinding
from lightkube.resources.resource_v1 import ResourceClaim, ResourceClaimTemplate

from accel_core.fakehost import build_host

Wait = Callable[..., Any]
FakeNode = Callable[..., str]

CHART = REPO / "charts" / "neuron-helm-chart"
FLAGS = ("--set", "devicePlugin.enabled=false", "--set", "draDriver.enabled=true", "--set", "npd.enabled=false",
         "--set", "draDriver.extendedResource=true")  # the class serves aws.amazon.com/neuron too
EFA_CHART = REPO / "charts" / "aws-efa-k8s-device-plugin"
EFA_FLAGS = ("--set", "devicePlugin.enabled=false", "--set", "draDriver.enabled=true")
EXAMPLES = REPO / "examples"
SEEDS = ("neuron-dra/1x4-connected-neurons", "neuron-dra/all-neurons", "neuron-dra/all-neurons-lnc-1",
         "neuron-dra/eight-or-four-connected-neurons", "neuron-dra/trn2-else-trn1",
         "efa-dra/trn2-4-neurons-with-their-efa", "efa-dra/1-neuron-with-its-efa")
EFA_COUNT = {"trn2.48xlarge": 16, "trn1.32xlarge": 8}  # efa.md: one EFA per trn2 Neuron device, one per two on trn1
TRN2 = "device.attributes['neuron.aws.com'].instanceType == 'trn2.48xlarge'"


def template(name: str, count: int, expression: str = TRN2, match: str | None = None) -> dict[str, Any]:
    devices: dict[str, Any] = {"requests": [{"name": "neurons", "exactly": {
        "deviceClassName": "neuron.aws.com", "count": count, "selectors": [{"cel": {"expression": expression}}]}}]}
    if match:
        devices["constraints"] = [{"requests": ["neurons"], "matchAttribute": match}]
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate", "metadata": {"name": name},
            "spec": {"spec": {"devices": devices}}}


def seed_templates() -> list[dict[str, Any]]:
    docs = [d for n in SEEDS for d in yaml.safe_load_all((EXAMPLES / f"{n}.yaml").read_text())]
    return [d for d in docs if d and d["kind"] == "ResourceClaimTemplate"]


def explain(control_plane: ControlPlane, namespace: str, target: str, output: str = "json",
            module: str = "neuron_dra.dra.cli", kubeconfig: Path | None = None) -> Any:
    out = subprocess.run([sys.executable, "-m", module, "explain", target, "-n", namespace,
                          "--kubeconfig", str(kubeconfig or control_plane.admin_kubeconfig), "-o", output],
                         env={**os.environ, "PYTHONPATH": str(REPO)}, capture_output=True, text=True, timeout=60,
                         check=False)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout) if output == "json" else out.stdout


def scheduled_node(client: Client, namespace: str, pod: str) -> str | None:
    """The node the scheduler bound the pod to, "" when it marked it Unschedulable, None while undecided."""
    data = client.get(Pod, pod, namespace=namespace).to_dict()
    if data["spec"].get("nodeName"):
        return str(data["spec"]["nodeName"])
    for c in data.get("status", {}).get("conditions") or []:
        if c["type"] == "PodScheduled" and c["status"] == "False" and c.get("reason") == "Unschedulable":
            return ""
    return None


@pytest.fixture
def rig(control_plane: ControlPlane, kube_client: Client, fake_node: FakeNode, short_tmp: Path,
        wait: Wait) -> Iterator[list[str]]:
    """Two trn2.48xlarge nodes and a trn1.32xlarge, each publishing through its own Neuron and EFA drivers."""
    drivers: list[tuple[DriverProcess, int]] = []
    with chart_objects(control_plane, kube_client, CHART, FLAGS), \
            chart_objects(control_plane, kube_client, EFA_CHART, EFA_FLAGS):
        try:
            nodes = []
            for i, instance_type in enumerate(("trn2.48xlarge", "trn2.48xlarge", "trn1.32xlarge")):
                node = fake_node(labels={"node.kubernetes.io/instance-type": instance_type})
                root = short_tmp / f"n{i}"
                build_host(root / "host", instance_type)
                for kind, count in ((NEURON, 16), (EFA, EFA_COUNT[instance_type])):
                    driver = DriverProcess(kind, root, node,
                                           pod_bound_kubeconfig(control_plane, kube_client, kind, node, wait))
                    driver.start()
                    drivers.append((driver, count))
                nodes.append(node)
            for driver, count in drivers:
                wait_published(kube_client, driver, count, wait)
            yield nodes
        finally:
            for driver, _ in drivers:
                if driver.running():
                    driver.stop()
                with contextlib.suppress(ApiError):
                    kube_client.delete(Pod, f"{driver.kind.driver.split('.')[0]}-driver-{driver.node}"[:63],
                                       namespace=driver.kind.namespace, grace_period=0)


def place_everywhere(client: Client, namespace: str, name: str, nodes: list[str], wait: Wait) -> dict[str, bool]:
    """One pod of template ``name`` pinned to each node: node -> whether the scheduler bound it there."""
    for node in nodes:
        make_pod(client, namespace, f"{name}-{nodes.index(node)}", template=name, node=node)
    decided: dict[str, bool] = {}

    def all_decided() -> bool:
        for i, node in enumerate(nodes):
            if node not in decided:
                where = scheduled_node(client, namespace, f"{name}-{i}")
                if where is not None:
                    assert where in ("", node)
                    decided[node] = where == node
        return len(decided) == len(nodes)

    wait(all_decided, f"the scheduler's decision on {name} for each node", timeout=120)
    return decided


def namespace_reader(control_plane: ControlPlane, client: Client, namespace: str) -> Path:
    """A ServiceAccount token that reads claims, templates and pods of ``namespace`` only, plus DeviceClasses and
    ResourceSlices (cluster-wide objects a DRA user reads): no other namespace's claims, no Nodes."""
    resource = "resource.k8s.io"
    client.create(ServiceAccount.from_dict({"metadata": {"name": "reader", "namespace": namespace}}))
    client.create(Role.from_dict({"metadata": {"name": "reader", "namespace": namespace}, "rules": [
        {"apiGroups": [resource], "resources": ["resourceclaims", "resourceclaimtemplates"], "verbs": ["get", "list"]},
        {"apiGroups": [""], "resources": ["pods"], "verbs": ["get"]}]}))
    ref = {"kind": "ServiceAccount", "name": "reader", "namespace": namespace}
    client.create(RoleBinding.from_dict({"metadata": {"name": "reader", "namespace": namespace}, "subjects": [ref],
                                         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role",
                                                     "name": "reader"}}))
    cluster = f"explain-reader-{namespace}"
    client.create(ClusterRole.from_dict({"metadata": {"name": cluster}, "rules": [
        {"apiGroups": [resource], "resources": ["deviceclasses", "resourceslices"], "verbs": ["list"]}]}))
    client.create(ClusterRoleBinding.from_dict({"metadata": {"name": cluster}, "subjects": [ref], "roleRef": {
        "apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": cluster}}))
    return control_plane.kubeconfig_for_token(str(control_plane.mint_token(namespace, "reader")), name=cluster)


def remove_pods(client: Client, namespace: str, pods: list[str], wait: Wait) -> None:
    claims = [c for c in (pod_claim_name(client, namespace, p) for p in pods) if c]
    for pod in pods:
        client.delete(Pod, pod, namespace=namespace, grace_period=0)

    def gone() -> bool:
        names = {c.metadata.name for c in client.list(ResourceClaim, namespace=namespace)}  # type: ignore[union-attr]
        return not names & set(claims)

    wait(gone, "the pods' claims deleted", timeout=90)


@pytest.mark.timeout(900)
def test_explain_agrees_with_the_scheduler(control_plane: ControlPlane, kube_client: Client, rig: list[str],
                                           namespace: str, wait: Wait) -> None:
    trn2_a, trn2_b, trn1 = rig
    pending = {
        "five-connected": template("five-connected", 5, match="resource.aws.com/devicegroup4_id"),
        "no-match": template("no-match", 1, "device.attributes['neuron.aws.com'].instanceType == 'p9.fake'"),
        "seventeen": template("seventeen", 17, "device.driver == 'neuron.aws.com'"),
    }
    for body in [*seed_templates(), *pending.values(), template("hold-13", 13)]:
        kube_client.create(ResourceClaimTemplate.from_dict(body), namespace=namespace)  # type: ignore[call-overload]

    # what fits where today, and what the scheduler does, for each template
    expected_fits = {
        "1x4-connected-neurons": {trn2_a, trn2_b}, "all-neurons": {trn2_a, trn2_b},
        "all-neurons-lnc-1": {trn2_a, trn2_b}, "eight-or-four-connected-neurons": set(rig),
        "trn2-else-trn1": set(rig), "trn2-4-neurons-with-their-efa": {trn2_a, trn2_b},
        "1-neuron-with-its-efa": set(rig),
        "five-connected": set(), "no-match": set(), "seventeen": set()}
    seconds: list[float] = []
    engine: list[float] = []
    for name, fits in expected_fits.items():
        started = time.perf_counter()
        verdict = explain(control_plane, namespace, f"resourceclaimtemplate/{name}")
        seconds.append(time.perf_counter() - started)
        engine.append(verdict["seconds"])
        assert set(verdict["nodes"]) == set(rig), verdict
        assert set(verdict["fits"]) == fits, (name, verdict)
        assert all(v["fits"] is not None for v in verdict["nodes"].values()), verdict
        if name == "trn2-4-neurons-with-their-efa":  # the EFA driver's explain is the same generic one
            efa = explain(control_plane, namespace, f"resourceclaimtemplate/{name}", module="efa_plugin.dra.cli")
            assert efa["fits"] == verdict["fits"] and efa["nodes"] == verdict["nodes"], efa
        scheduler = place_everywhere(kube_client, namespace, name, rig, wait)
        assert {n for n, bound in scheduler.items() if bound} == set(verdict["fits"]), (name, scheduler, verdict)

        # a pending pod's explanation (its own claim now exists) says why, for its node only
        for i, node in enumerate(rig):
            if scheduler[node]:
                continue
            why = explain(control_plane, namespace, f"pod/{name}-{i}")
            assert why["skippedNodes"] == sorted(set(rig) - {node}) and why["fits"] == [], why
            reasons = " ".join(why["nodes"][node]["reasons"])
            if name == "five-connected" and node != trn1:
                assert "group by value as 4+4+4+4" in reasons and "sizes 1, 4, 8 and 16" in reasons, reasons
                text = explain(control_plane, namespace, f"pod/{name}-{i}", "text")
                assert f"node {node}: does not fit\n" in text and "verdict: fits on 0 of 1 node(s)" in text, text
                print(f"\n{text}")
            if name == "no-match" or (node == trn1 and name in ("1x4-connected-neurons", "all-neurons")):
                assert "no device matches" in reasons and "rejects 16 (neuron-device-0..15)" in reasons, reasons
            if name == "seventeen":
                assert "asks for 17 devices, only 16 of the node's 16 devices of class neuron.aws.com match" \
                    in reasons, reasons
        remove_pods(kube_client, namespace, [f"{name}-{i}" for i in range(len(rig))], wait)

    # devices another claim holds: 13 of trn2_a taken, so 4 connected fit only on trn2_b
    make_pod(kube_client, namespace, "hold", template="hold-13", node=trn2_a)
    wait(lambda: scheduled_node(kube_client, namespace, "hold") == trn2_a, "the 13-device claim on the first trn2")
    holder = pod_claim_name(kube_client, namespace, "hold")
    held = explain(control_plane, namespace, f"resourceclaim/{holder}")
    assert held["claims"] == [] and held["allocated"] == [
        f"claim {holder} is allocated: " + ", ".join(f"neuron-device-{i}" for i in range(13)) + f" on node {trn2_a}"]
    verdict = explain(control_plane, namespace, "resourceclaimtemplate/1x4-connected-neurons")
    assert verdict["fits"] == [trn2_b], verdict
    reasons = " ".join(verdict["nodes"][trn2_a]["reasons"])
    assert f"only 3 of 16 matching devices are free: 13 held by claim {namespace}/{holder}" in reasons, reasons
    scheduler = place_everywhere(kube_client, namespace, "1x4-connected-neurons", rig, wait)
    assert {n for n, bound in scheduler.items() if bound} == {trn2_b}, scheduler
    chosen = {d["device"] for d in verdict["nodes"][trn2_b]["devices"]}
    claim = kube_client.get(ResourceClaim, pod_claim_name(kube_client, namespace, "1x4-connected-neurons-1") or "",
                            namespace=namespace).to_dict()
    assert {r["device"] for r in claim["status"]["allocation"]["devices"]["results"]} == chosen

    # a user who may read only their own namespace's claims (and no Nodes) still gets the verdict, with a caveat
    kubeconfig = namespace_reader(control_plane, kube_client, namespace)
    limited = explain(control_plane, namespace, "resourceclaimtemplate/1x4-connected-neurons", kubeconfig=kubeconfig)
    assert limited["fits"] == [trn2_b] and limited["notes"] == [
        f"claims outside {namespace} cannot be listed (forbidden): devices they hold count as free here"], limited
    for kind in (ClusterRoleBinding, ClusterRole):
        kube_client.delete(kind, f"explain-reader-{namespace}")

    # device-plugin pod specs served by DRA: the claim kube-scheduler would make, explained before it exists
    for pod, node, count in (("ext-4", trn2_a, 4), ("ext-17", trn1, 17), ("ext-2", trn2_a, 2)):
        kube_client.create(Pod.from_dict({  # type: ignore[call-overload]
            "metadata": {"name": pod, "namespace": namespace},
            "spec": {"nodeSelector": {"kubernetes.io/hostname": node}, "containers": [
                {"name": "app", "image": "busybox:test", "resources": {"limits": {"aws.amazon.com/neuron": count}}}]}}))
        where = wait(lambda pod=pod: scheduled_node(kube_client, namespace, pod), f"a decision on {pod}", timeout=120) \
            if count == 2 else wait(lambda pod=pod: scheduled_node(kube_client, namespace, pod) == "",
                                    f"{pod} Unschedulable", timeout=120)
        why = explain(control_plane, namespace, f"pod/{pod}")
        if count == 2:  # fits in the 3 free devices: scheduled there, and explain shows the scheduler's claim
            assert where == trn2_a and why["claims"] == [] and why["allocated"][0].startswith(
                "claim extended resources (aws.amazon.com/neuron) (resourceclaim "), why
            made = kube_client.get(Pod, pod, namespace=namespace).to_dict()["status"]["extendedResourceClaimStatus"]
            requests = kube_client.get(ResourceClaim, made["resourceClaimName"], namespace=namespace).to_dict()[
                "spec"]["devices"]["requests"]  # what explain assumed the scheduler makes
            assert [(r["exactly"]["deviceClassName"], r["exactly"]["count"]) for r in requests] == [
                ("neuron.aws.com", 2)], requests
            continue
        assert why["fits"] == [] and list(why["nodes"]) == [node], why
        reasons = " ".join(why["nodes"][node]["reasons"])
        expected = (f"only 3 of 16 matching devices are free: 13 held by claim {namespace}/{holder}" if count == 4
                    else "asks for 17 devices, only 16 of the node's 16 devices of class neuron.aws.com match")
        assert expected in reasons, reasons

    # one explain of a template on this 3-node rig, as a user runs it (a new process: imports, kubeconfig, 4 LISTs)
    print(f"\nexplain on 3 nodes: median {sorted(seconds)[len(seconds) // 2]:.2f} s, max {max(seconds):.2f} s "
          f"(the verdict itself: median {sorted(engine)[len(engine) // 2] * 1000:.0f} ms)")
