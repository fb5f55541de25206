"""neuron-scheduler-extender behind a second REAL kube-scheduler (``my-scheduler``, the name the AWS documents use),
on real kubelet nodes (trn2.48xlarge and trn1.32xlarge fake hosts) whose Neuron device plugins publish their usage.
They talk as the chart configures them: mutual TLS with the certificates the chart makes (its rendered Secrets).

Expected values come from AWS's descriptions, not from our code: both instances have 16 devices in a 4x4 torus,
device i at row i/4; a connected set of 4 devices is one torus row (0-3, 4-7, 8-11, 12-15); neighbours are
up/down/left/right with wrap-around; trn2 has 4 logical cores per device at LNC 2, trn1 has 2.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import os
import posixpath
import re
import socket
import ssl
import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml
from accel_rig.controlplane import ControlPlane
from chart_render import NEURON_CHART, Rendered, find_or_build_helm, template
from conftest import Daemon, RealNode, console_script
from kube_helpers import NEURON, NEURONCORE, allocatable, create_pod, pod_gone, pod_phase
from lightkube import ApiError, Client
from lightkube.resources.core_v1 import Node, Pod
from lightkube.resources.resource_v1 import DeviceClass, ResourceSlice

Wait = Callable[..., Any]
USAGE = "neuron.amazonaws.com/device-usage"
ROWS = [set(range(r * 4, r * 4 + 4)) for r in range(4)]


def torus_neighbours(i: int) -> set[int]:
    row, col = divmod(i, 4)
    return {((row - 1) % 4) * 4 + col, ((row + 1) % 4) * 4 + col, row * 4 + (col - 1) % 4, row * 4 + (col + 1) % 4}


def connected(devices: set[int]) -> bool:
    """Connected on the 4x4 torus, by the neighbour definition above."""
    if len(devices) <= 1:
        return True
    start = next(iter(devices))
    seen, todo = {start}, [start]
    while todo:
        for j in torus_neighbours(todo.pop()):
            if j in devices and j not in seen:
                seen.add(j)
                todo.append(j)
    return seen == devices


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass(frozen=True)
class ChartTls:
    """The chart's scheduler TLS, written to local files: the extender's TLS environment (variable -> file) and
    my-scheduler's extender tlsConfig (key -> file), plus the host the server certificate is for."""

    extender_env: dict[str, str]
    scheduler_files: dict[str, str]
    server_name: str


def _secret_files(rendered: Rendered, deployment: str, mount: str, into: Path) -> dict[str, Path]:
    """Write the Secret a Deployment mounts at ``mount`` into ``into``; file name -> local path."""
    pod = rendered.get("Deployment", deployment)["spec"]["template"]["spec"]
    volume = next(m["name"] for m in pod["containers"][0]["volumeMounts"] if m["mountPath"] == mount)
    secret_name = next(v["secret"]["secretName"] for v in pod["volumes"] if v["name"] == volume)
    into.mkdir(parents=True, exist_ok=True)
    out = {}
    for name, value in rendered.get("Secret", secret_name)["data"].items():
        (into / name).write_bytes(base64.b64decode(value))
        out[name] = into / name
    return out


def chart_tls(rendered: Rendered, into: Path) -> ChartTls:
    config = yaml.safe_load(rendered.get("ConfigMap", "my-scheduler-config")["data"]["config.yaml"])
    (ext,) = config["extenders"]
    files = ext["tlsConfig"]
    client = _secret_files(rendered, "my-scheduler", posixpath.dirname(files["certFile"]), into / "client")
    extender = rendered.get("Deployment", "neuron-scheduler-extender")["spec"]["template"]["spec"]
    env = {e["name"]: e["value"] for e in extender["containers"][0]["env"]}
    server = _secret_files(rendered, "neuron-scheduler-extender", posixpath.dirname(env["TLS_CERT_FILE"]),
                           into / "server")
    return ChartTls({k: str(server[posixpath.basename(v)]) for k, v in env.items() if k.startswith("TLS_")},
                    {k: str(client[posixpath.basename(v)]) for k, v in files.items()},
                    urlsplit(ext["urlPrefix"]).hostname or "")


def scheduler_config(rendered: Rendered, kubeconfig: Path, extender_port: int, tls: ChartTls) -> dict[str, Any]:
    """The chart's KubeSchedulerConfiguration (scheduler.enabled=true), pointed at this cluster and this extender:
    the same https URL and TLS settings, with 127.0.0.1 for the Service's address (``serverName`` keeps the
    certificate check on the Service's name) and the chart's certificate files written locally."""
    config: dict[str, Any] = yaml.safe_load(rendered.get("ConfigMap", "my-scheduler-config")["data"]["config.yaml"])
    (ext,) = config["extenders"]
    assert ext["urlPrefix"].startswith("https://neuron-scheduler-extender.") and ext["enableHTTPS"] is True
    ext["urlPrefix"] = f"https://127.0.0.1:{extender_port}"
    ext["tlsConfig"] = {**tls.scheduler_files, "serverName": tls.server_name}
    config["clientConnection"] = {"kubeconfig": str(kubeconfig)}
    return config


@pytest.fixture(scope="module")
def rendered() -> Rendered:
    return template(find_or_build_helm(), NEURON_CHART, "--set", "scheduler.enabled=true")


@pytest.fixture
def tls(rendered: Rendered, tmp_path: Path) -> ChartTls:
    return chart_tls(rendered, tmp_path / "chart-tls")


@pytest.fixture
def my_scheduler(control_plane: ControlPlane, tmp_path: Path, rendered: Rendered,
                 tls: ChartTls) -> Iterator[Callable[[int], None]]:
    """Factory: start the real kube-scheduler as ``my-scheduler`` calling the extender on ``port``."""
    procs: list[subprocess.Popen[bytes]] = []

    def start(extender_port: int) -> None:
        config = tmp_path / "my-scheduler.yaml"
        config.write_text(yaml.safe_dump(scheduler_config(rendered, control_plane.state_dir / "scheduler.kubeconfig",
                                                          extender_port, tls)))
        log = (tmp_path / "my-scheduler.log").open("ab")
        kubeconfig = control_plane.state_dir / "scheduler.kubeconfig"
        procs.append(subprocess.Popen(
            [str(control_plane.binary("kube-scheduler")), f"--config={config}", "--bind-address=127.0.0.1",
             f"--secure-port={_free_port()}", f"--authentication-kubeconfig={kubeconfig}",
             f"--authorization-kubeconfig={kubeconfig}", f"--cert-dir={tmp_path / 'my-scheduler-certs'}", "--v=2"],
            stdout=log, stderr=subprocess.STDOUT))

    yield start
    log = tmp_path / "my-scheduler.log"
    if log.exists():  # shown with the test's output when it fails
        print("my-scheduler log (tail):\n" + "\n".join(log.read_text(errors="replace").splitlines()[-40:]))
    for p in procs:
        p.terminate()
        try:
            p.wait(timeout=15)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def my_pod(client: Client, namespace: str, name: str, limits: dict[str, str]) -> None:
    client.create(Pod.from_dict({  # type: ignore[call-overload]
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"schedulerName": "my-scheduler", "terminationGracePeriodSeconds": 1,
                 "containers": [{"name": "c", "image": "public.ecr.aws/docker/library/busybox:latest",
                                 "resources": {"limits": limits}}]}}))


def devices_of(node: RealNode, namespace: str, pod: str) -> set[int]:
    (ctr,) = node.kubelet.containers(pod, namespace)
    out = set()
    for path in ctr.device_paths:
        m = re.fullmatch(r"/dev/neuron(\d+)", path)
        assert m, path
        out.add(int(m.group(1)))
    return out


def node_of(client: Client, namespace: str, pod: str) -> str:
    spec = client.get(Pod, pod, namespace=namespace).spec
    return (spec.nodeName or "") if spec else ""


def unschedulable_message(client: Client, namespace: str, pod: str) -> str:
    status = client.get(Pod, pod, namespace=namespace).status
    for cond in (status.conditions or []) if status else []:
        if cond.type == "PodScheduled" and cond.status == "False":
            return cond.message or ""
    return ""


def usage_of(client: Client, node: str) -> dict[str, Any] | None:
    meta = client.get(Node, node).metadata
    value = ((meta.annotations or {}) if meta else {}).get(USAGE)
    return yaml.safe_load(value) if value else None


def running(client: Client, namespace: str, *pods: str) -> bool:
    return all(pod_phase(client, namespace, p) == "Running" for p in pods)


def delete(client: Client, namespace: str, *pods: str) -> None:
    for p in pods:
        with contextlib.suppress(ApiError):
            client.delete(Pod, p, namespace=namespace, grace_period=0)


def forged_filter(uid: str, neuron: int, node: str, annotation: str | None) -> bytes:
    """A filter call as a forger would send it: a pod that does not exist, a node, optionally its annotation."""
    pod = {"metadata": {"name": f"forged-{uid}", "namespace": "default", "uid": uid},
           "spec": {"schedulerName": "my-scheduler",
                    "containers": [{"name": "c", "resources": {"limits": {NEURON: str(neuron)}}}]}}
    meta: dict[str, Any] = {"name": node}
    if annotation is not None:
        meta["annotations"] = {USAGE: annotation}
    return json.dumps({"Pod": pod, "Nodes": {"items": [{"metadata": meta}]}}).encode()


def post_filter(port: int, body: bytes, ctx: ssl.SSLContext | None, server_name: str) -> bytes | str:
    """POST /filter to the extender: the raw answer, or the name of the error that ended the connection."""

    async def run() -> bytes:
        reader, writer = await asyncio.wait_for(asyncio.open_connection(
            "127.0.0.1", port, ssl=ctx, server_hostname=server_name if ctx else None), 10)
        head = f"POST /filter HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Length: {len(body)}\r\n\r\n"
        writer.write(head.encode() + body)
        await writer.drain()
        data = await asyncio.wait_for(reader.read(), 10)
        writer.close()
        return data

    try:
        return asyncio.run(run())
    except (ssl.SSLError, ConnectionError) as exc:
        return type(exc).__name__


def passed_nodes(answer: bytes | str) -> list[str]:
    assert isinstance(answer, bytes) and answer.startswith(b"HTTP/1.1 200"), answer
    return [n["metadata"]["name"] for n in json.loads(answer.partition(b"\r\n\r\n")[2])["nodes"]["items"]]


def test_extender_places_only_connected_sets_with_the_real_scheduler(
        kubelet_node: Callable[..., RealNode], daemon: Callable[..., Daemon], kube_client: Client,
        control_plane: ControlPlane, my_scheduler: Callable[[int], None], namespace: str, wait: Wait,
        tmp_path: Path, tls: ChartTls) -> None:
    trn2 = kubelet_node("trn2.48xlarge")
    trn1 = kubelet_node("trn1.32xlarge")
    nodes = {trn2.name: trn2, trn1.name: trn1}
    for node in (trn2, trn1):
        daemon("neuron-device-plugin", "serve", "--metrics-port", "0", "--pod-resources-interval", "0.5",
               env=node.env())
    for node, cores in ((trn2, 64), (trn1, 32)):
        wait(lambda n=node, c=cores: (allocatable(kube_client, n.name, NEURON),
                                      allocatable(kube_client, n.name, NEURONCORE)) == (16, c),
             f"neuron 16 / neuroncore {cores} on {node.name}", timeout=90)
        wait(lambda n=node: usage_of(kube_client, n.name), f"the device-usage annotation on {node.name}")
    port = _free_port()
    env = {"KUBECONFIG": str(control_plane.admin_kubeconfig), **tls.extender_env}
    extender = daemon("neuron-scheduler-extender", "serve", "--port", str(port), "--metrics-port", "0", env=env)
    my_scheduler(port)

    # 1. Fragment both nodes with the default scheduler: pairs of devices (neuron: 2 on trn2; neuroncore: 4 = two
    #    whole devices on trn1), then keep one pair per torus row. 8 devices stay free per node, no row is free.
    holders: dict[str, dict[int, str]] = {}  # node -> row -> the pod kept in it
    for node, limits in ((trn2, {NEURON: "2"}), (trn1, {NEURONCORE: "4"})):
        names = [f"frag-{node.name}-{i}" for i in range(8)]
        for name in names:
            create_pod(kube_client, namespace, name, node.name, limits=limits)
        wait(lambda ns=names: running(kube_client, namespace, *ns), f"8 fragmenting pods on {node.name}", timeout=180)
        by_row: dict[int, list[str]] = {}
        for name in names:
            devs = devices_of(node, namespace, name)
            assert len(devs) == 2 and len({d // 4 for d in devs}) == 1, (name, devs)
            by_row.setdefault(min(devs) // 4, []).append(name)
        holders[node.name] = {row: pods[0] for row, pods in by_row.items()}
        delete(kube_client, namespace, *[p for pods in by_row.values() for p in pods[1:]])
    for node in (trn2, trn1):
        wait(lambda n=node: len(usage_of(kube_client, n.name)["neuron" if n is trn2 else "neuroncore"]) ==
             (8 if n is trn2 else 16), f"{node.name} reports 8 devices in use", timeout=60)

    # Under default scheduling the counts fit, so a neuron: 4 pod is placed on a node without a free row and gets
    # devices that are not one row.
    create_pod(kube_client, namespace, "default-4", trn2.name, limits={NEURON: "4"})
    wait(lambda: running(kube_client, namespace, "default-4"), "the default-scheduler neuron: 4 pod Running")
    assert devices_of(trn2, namespace, "default-4") not in ROWS
    delete(kube_client, namespace, "default-4")
    wait(lambda: pod_gone(kube_client, namespace, "default-4"), "default-4 gone")
    wait(lambda: len(usage_of(kube_client, trn2.name)["neuron"]) == 8, "trn2 back to 8 devices in use", timeout=60)

    # 2. With my-scheduler the same pod fits no node: Pending, with a reason naming the missing connected set.
    my_pod(kube_client, namespace, "wide", {NEURON: "4"})
    message = wait(lambda: unschedulable_message(kube_client, namespace, "wide"), "wide reported unschedulable")
    assert "no free connected set of 4 aws.amazon.com/neuron devices" in message, message
    assert node_of(kube_client, namespace, "wide") == ""
    # explain says the same for people, with the free devices that hold no row.
    manifest = tmp_path / "wide.yaml"
    manifest.write_text(yaml.safe_dump(kube_client.get(Pod, "wide", namespace=namespace).to_dict()))
    answer = subprocess.run([sys.executable, *console_script("neuron-scheduler-extender"), "explain", "--node",
                             trn2.name, "--pod", str(manifest)], env={**os.environ, **env}, capture_output=True,
                            text=True, timeout=60, check=False)
    assert answer.returncode == 1, answer.stderr
    assert "does not fit" in answer.stdout and "no free connected set of 4" in answer.stdout, answer.stdout

    # 3. Free a row on trn1: the waiting pod gets exactly that row.
    freed_row = 1
    delete(kube_client, namespace, holders[trn1.name][freed_row])
    wait(lambda: running(kube_client, namespace, "wide"), "wide Running once a row is free", timeout=120)
    assert node_of(kube_client, namespace, "wide") == trn1.name
    assert devices_of(trn1, namespace, "wide") == ROWS[freed_row]

    # 4. Mixed small pods: neuron pairs are torus neighbours, NeuronCores are packed on connected devices.
    my_pod(kube_client, namespace, "pair", {NEURON: "2"})
    my_pod(kube_client, namespace, "cores", {NEURONCORE: "4"})
    wait(lambda: running(kube_client, namespace, "pair", "cores"), "pair and cores Running", timeout=120)
    for pod, want in (("pair", 2), ("cores", None)):
        node = nodes[node_of(kube_client, namespace, pod)]
        devs = devices_of(node, namespace, pod)
        per = 4 if node is trn2 else 2
        assert len(devs) == (want or 4 // per) and connected(devs), (pod, node.name, devs)

    # 5. The extender dies mid-sequence: pods wait (the extender is not ignorable) and nothing is lost after it
    #    comes back.
    extender.stop(9)
    my_pod(kube_client, namespace, "during", {NEURONCORE: "2"})
    wait(lambda: "extender" in unschedulable_message(kube_client, namespace, "during").lower()
         or "connection refused" in unschedulable_message(kube_client, namespace, "during"),
         "during reported unschedulable while the extender is down", timeout=60)
    assert node_of(kube_client, namespace, "during") == ""
    daemon("neuron-scheduler-extender", "serve", "--port", str(port), "--metrics-port", "0", env=env)
    wait(lambda: running(kube_client, namespace, "during"), "during Running after the extender is back", timeout=120)
    node = nodes[node_of(kube_client, namespace, "during")]
    assert connected(devices_of(node, namespace, "during"))

    # 6. Back to back: two neuron: 4 pods, one free row in the whole cluster. They never share it, and the one left
    #    waiting gets a row of its own once another is freed.
    def occupied(node: RealNode) -> set[int]:
        usage = usage_of(kube_client, node.name) or {}
        per = usage.get("coresPerDevice") or 1
        return set(usage.get("neuron", [])) | {c // per for c in usage.get("neuroncore", [])}

    def row_held_only_by_its_holder() -> tuple[RealNode, int]:
        """A (node, row) whose only occupant is the fragmenting pod kept there: deleting it frees the row."""
        for node in (trn2, trn1):
            for r, holder in holders[node.name].items():
                if not pod_gone(kube_client, namespace, holder) and \
                        occupied(node) & ROWS[r] == devices_of(node, namespace, holder):
                    return node, r
        raise AssertionError("no row is held by its fragmenting pod alone")

    def free_a_row(*, observe: bool) -> tuple[RealNode, int]:
        """Delete the holder of a row. With ``observe``, wait until the row is reported free; without it (a pod is
        waiting for that row), the scheduler may take the row before any poll of ours sees it free."""
        node, r = row_held_only_by_its_holder()
        delete(kube_client, namespace, holders[node.name][r])
        if observe:
            wait(lambda: not occupied(node) & ROWS[r], f"row {r} of {node.name} reported free", timeout=120)
        return node, r

    node1, row1 = free_a_row(observe=True)

    # 6a. Who may change the extender's state, while exactly one row of node1 is free.
    annotation = json.dumps(usage_of(kube_client, node1.name))
    forged = forged_filter("u-evil", 4, node1.name, annotation)
    ca_only = ssl.create_default_context(cafile=tls.scheduler_files["caFile"])
    as_scheduler = ssl.create_default_context(cafile=tls.scheduler_files["caFile"])
    as_scheduler.load_cert_chain(tls.scheduler_files["certFile"], tls.scheduler_files["keyFile"])
    #     A client without the scheduler's certificate, or speaking plain HTTP, is refused before any HTTP.
    for who, ctx in (("without a client certificate", ca_only), ("over plain HTTP", None)):
        answer = post_filter(port, forged, ctx, tls.server_name)
        assert not (isinstance(answer, bytes) and b"HTTP/1.1 2" in answer), f"{who}: {answer!r}"
    #     Even over the scheduler's own channel, a filter for a pod the API server does not have (the node named with
    #     and without its annotation, as the outside tester did) reserves nothing: the row stays free for others.
    assert passed_nodes(post_filter(port, forged, as_scheduler, tls.server_name)) == [node1.name]
    assert passed_nodes(post_filter(port, forged_filter("u-evil2", 16, node1.name, None), as_scheduler,
                                    tls.server_name)) == [node1.name]
    probe = post_filter(port, forged_filter("u-probe", 4, node1.name, annotation), as_scheduler, tls.server_name)
    assert passed_nodes(probe) == [node1.name], probe

    my_pod(kube_client, namespace, "twin-a", {NEURON: "4"})
    my_pod(kube_client, namespace, "twin-b", {NEURON: "4"})
    first = wait(lambda: next((p for p in ("twin-a", "twin-b") if running(kube_client, namespace, p)), None),
                 "one twin Running", timeout=120)
    other = "twin-b" if first == "twin-a" else "twin-a"
    assert node_of(kube_client, namespace, first) == node1.name
    assert devices_of(node1, namespace, first) == ROWS[row1]
    message = wait(lambda: unschedulable_message(kube_client, namespace, other), f"{other} unschedulable")
    assert "no free connected set of 4" in message and node_of(kube_client, namespace, other) == "", message
    node2, row2 = free_a_row(observe=False)
    wait(lambda: running(kube_client, namespace, other), f"{other} Running once a second row is free", timeout=120)
    assert node_of(kube_client, namespace, other) == node2.name
    assert devices_of(node2, namespace, other) == ROWS[row2]


def test_my_scheduler_places_device_plugin_pod_specs_on_a_node_moved_to_dra(
        kubelet_node: Callable[..., RealNode], daemon: Callable[..., Daemon], kube_client: Client,
        control_plane: ControlPlane, my_scheduler: Callable[[int], None], namespace: str, wait: Wait,
        tls: ChartTls) -> None:
    """A node moved from the device plugin to the DRA driver (docs/charts.md, node by node) keeps the plugin's last
    device-usage annotation, which no longer changes: here 12 devices in use by a pod that has since ended. Its
    allocatable offers no aws.amazon.com/neuron, so the extender leaves it to the scheduler's own checks, and an
    unchanged ``neuron: 8`` pod of my-scheduler lands on it through DRA's extended resource."""
    rendered = template(find_or_build_helm(), NEURON_CHART, "--set", "draDriver.enabled=true",
                        "--set", "devicePlugin.enabled=false", "--set", "draDriver.extendedResource=true")
    device_class = rendered.get("DeviceClass", "neuron.aws.com")
    assert device_class["spec"]["extendedResourceName"] == NEURON
    with contextlib.suppress(ApiError):
        kube_client.delete(DeviceClass, "neuron.aws.com")
    kube_client.create(DeviceClass.from_dict(device_class))  # type: ignore[call-overload]
    trn2 = kubelet_node("trn2.48xlarge")
    plugin = daemon("neuron-device-plugin", "serve", "--metrics-port", "0", "--pod-resources-interval", "0.5",
                    env=trn2.env())
    wait(lambda: allocatable(kube_client, trn2.name, NEURON) == 16, "neuron 16 from the device plugin", timeout=90)
    create_pod(kube_client, namespace, "old", trn2.name, limits={NEURON: "12"})
    wait(lambda: running(kube_client, namespace, "old"), "the device-plugin pod Running", timeout=120)
    wait(lambda: len((usage_of(kube_client, trn2.name) or {}).get("neuron", [])) == 12,
         "the annotation: 12 devices in use", timeout=60)

    # The migration label removes the device plugin's pod from the node, and the DRA driver's pod starts there.
    plugin.stop()
    daemon("neuron-dra-driver", "serve", "--metrics-port", "0", "--healthcheck-port", "-1", "--rescan-interval", "1",
           env=trn2.env(POD_UID="moved-pod"))

    def published() -> int:
        return sum(len(s.spec.devices or []) for s in kube_client.list(
            ResourceSlice, fields={"spec.nodeName": trn2.name, "spec.driver": "neuron.aws.com"}))

    wait(lambda: published() == 4 and not allocatable(kube_client, trn2.name, NEURON),
         "DRA serving the 4 devices the old pod does not hold", timeout=120)
    delete(kube_client, namespace, "old")
    wait(lambda: published() == 16, "all 16 published once the old pod is gone", timeout=60)
    assert len(usage_of(kube_client, trn2.name)["neuron"]) == 12, "the annotation is the plugin's last word"

    port = _free_port()
    daemon("neuron-scheduler-extender", "serve", "--port", str(port), "--metrics-port", "0",
           env={"KUBECONFIG": str(control_plane.admin_kubeconfig), **tls.extender_env})
    my_scheduler(port)
    my_pod(kube_client, namespace, "moved", {NEURON: "8"})
    wait(lambda: running(kube_client, namespace, "moved"), "my-scheduler's neuron: 8 pod Running through DRA",
         timeout=120)
    status = kube_client.get(Pod, "moved", namespace=namespace).to_dict()["status"]
    assert node_of(kube_client, namespace, "moved") == trn2.name
    assert status["extendedResourceClaimStatus"]["requestMappings"][0]["resourceName"] == NEURON, status
    delete(kube_client, namespace, "moved")
    wait(lambda: pod_gone(kube_client, namespace, "moved"), "moved deleted", timeout=60)
    kube_client.delete(DeviceClass, "neuron.aws.com")
