"""kubectl habits on rig nodes, with the cluster's own kubectl (v1.37.2) against the real API server and a real
kubelet on containerd: ``kubectl logs`` (``-f``, ``--previous``, ``--tail``), ``exec``, ``port-forward`` and the API
server's service and pod proxy to the EFA chart's metrics port (9810, the chart's default ``metrics.port``).

The API server reaches a node's kubelet and its pods only through the rig's egress proxy (its ``cluster`` egress
selection): the nodes and pods live in network namespaces of their own. And one release of each chart with one
``fakeHost.path`` (the fixed in-node path) serves a p5.48xlarge and two trn2.48xlarge nodes, each with its own
devices. Expected counts are AWS facts (reference efa.md, neuron.md): EFA devices p5.48xlarge 32, trn2.48xlarge 16;
a trn2.48xlarge has 16 Trainium2 devices and 64 logical NeuronCores at the default LNC 2.
"""

from __future__ import annotations

import os
import re
import subprocess
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from accel_rig.containerdnode import FAKE_HOST_IN_NODE
from accel_rig.controlplane import ControlPlane
from accel_rig.nodelayout import CONTAINERD
from chart_render import EFA_CHART, NEURON_CHART, SEED_DEVICE_PLUGIN_INSTALL
from kube_fixtures import RealNode
from lightkube import Client
from lightkube.resources.core_v1 import Pod, Service
from runtime_helpers import (
    BUSYBOX,
    Helm,
    allocatable,
    applied,
    chart_image,
    ds_ready,
    pods_of,
    port_forward,
    running_1_of_1,
)

pytestmark = pytest.mark.containerd

Wait = Callable[..., object]
NodeFactory = Callable[..., RealNode]
EFA_DS = "aws-efa-k8s-device-plugin-daemonset"
NEURON_DP_DS = "neuron-device-plugin"
METRICS_PORT = 9810
#: AWS facts (reference efa.md, neuron.md), not our catalog's.
EFA_OF = {"p5.48xlarge": 32, "trn2.48xlarge": 16}
TRN2_DEVICES, TRN2_CORES_LNC2 = 16, 64
#: A container that counts its runs in an emptyDir, prints 10 lines and exits on its first run, and prints a line
#: every 0.2 s on later runs.
TALKER = ("n=$(cat /data/n 2>/dev/null || echo 0); n=$((n+1)); echo $n >/data/n; i=0; "
          "while [ $n -gt 1 ] || [ $i -lt 10 ]; do echo run-$n line-$i; i=$((i+1)); sleep 0.2; done; exit 1")


@pytest.fixture
def helm(control_plane: ControlPlane, tmp_path: Path) -> Helm:
    return Helm(control_plane, tmp_path)


class Kubectl:
    """The cluster's own kubectl as a person runs it (KUBECONFIG in the environment, no HTTP proxy)."""

    def __init__(self, control_plane: ControlPlane) -> None:
        self.path = str(control_plane.kubectl)
        self.env = {k: v for k, v in os.environ.items() if k != "KUBECONFIG" and not k.lower().endswith("_proxy")}
        self.env["KUBECONFIG"] = str(control_plane.admin_kubeconfig)

    def __call__(self, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        return subprocess.run([self.path, *args], capture_output=True, text=True, env=self.env, timeout=timeout,
                              check=False)

    def popen(self, *args: str) -> subprocess.Popen[str]:
        return subprocess.Popen([self.path, *args], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                env=self.env)


@pytest.fixture
def kubectl(control_plane: ControlPlane) -> Kubectl:
    return Kubectl(control_plane)


@pytest.fixture
def p5_with_efa(kubelet_node: NodeFactory, kube_client: Client, helm: Helm, wait: Wait) -> Iterator[RealNode]:
    p5 = kubelet_node("p5.48xlarge", runtime=CONTAINERD)
    helm("upgrade", "--install", "aws-efa-k8s-device-plugin", str(EFA_CHART), "--namespace", "kube-system",
         "--set", "image.pullPolicy=Never", "--set", f"fakeHost.path={FAKE_HOST_IN_NODE}")
    try:
        wait(lambda: ds_ready(kube_client, "kube-system", EFA_DS), f"{EFA_DS} READY 1", timeout=180)
        yield p5
    finally:
        helm("uninstall", "aws-efa-k8s-device-plugin", "--namespace", "kube-system", "--wait", "--timeout", "120s")


def _efa_pod(client: Client) -> str:
    (pod,) = [p for p in pods_of(client, "kube-system", {"name": "aws-efa-k8s-device-plugin"}) if running_1_of_1(p)]
    return str(pod["metadata"]["name"])


def _healthy_efa(metrics: str) -> int:
    return len(re.findall(r"^efa_device_healthy\{.*\} 1\.0$", metrics, re.M))


def test_service_and_pod_proxy_reach_the_efa_metrics_port(p5_with_efa: RealNode, kube_client: Client, kubectl: Kubectl,
                                                          wait: Wait) -> None:
    """`kubectl get --raw .../services/SVC:9810/proxy/metrics` and the pods/proxy form return the plugin's metrics:
    32 healthy EFA devices of the p5 (the API server reached the pod's address inside the node's namespace)."""
    (svc,) = [s.metadata.name for s in kube_client.list(Service, namespace="kube-system")
              if s.metadata is not None and s.metadata.name is not None and s.metadata.name.endswith("-metrics")
              and "efa" in s.metadata.name]
    pod = _efa_pod(kube_client)
    paths = {"service": f"/api/v1/namespaces/kube-system/services/{svc}:{METRICS_PORT}/proxy/metrics",
             "pod": f"/api/v1/namespaces/kube-system/pods/{pod}:{METRICS_PORT}/proxy/metrics"}
    for what, path in paths.items():
        out = wait(lambda p=path: (r := kubectl("get", "--raw", p)).returncode == 0 and r, f"{what} proxy answers",
                   timeout=60)
        assert isinstance(out, subprocess.CompletedProcess)
        assert _healthy_efa(out.stdout) == EFA_OF["p5.48xlarge"], out.stdout[:2000]
    # The node proxy too (the kubelet's own endpoint, through its address in the node's namespace).
    node = kubectl("get", "--raw", f"/api/v1/nodes/{p5_with_efa.name}/proxy/healthz")
    assert node.returncode == 0 and node.stdout == "ok", node.stderr


def test_logs_exec_and_port_forward(p5_with_efa: RealNode, kube_client: Client, kubectl: Kubectl, namespace: str,
                                    wait: Wait) -> None:
    node = p5_with_efa.name
    # logs of the EFA plugin's container, as the seeds' troubleshooting reads them
    efa = kubectl("logs", "-n", "kube-system", _efa_pod(kube_client), "--tail", "200")
    assert efa.returncode == 0, efa.stderr
    assert efa.stdout.strip(), "the EFA plugin logged nothing"
    talker = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "talker"},
              "spec": {"nodeName": node, "restartPolicy": "Always", "terminationGracePeriodSeconds": 1,
                       "tolerations": [{"operator": "Exists"}],
                       "volumes": [{"name": "data", "emptyDir": {}}],
                       "containers": [{"name": "app", "image": BUSYBOX, "imagePullPolicy": "Never",
                                       "command": ["sh", "-c", TALKER],
                                       "volumeMounts": [{"name": "data", "mountPath": "/data"}]}]}}
    web = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "web"},
           "spec": {"nodeName": node, "restartPolicy": "Never", "terminationGracePeriodSeconds": 1,
                    "tolerations": [{"operator": "Exists"}],
                    "containers": [{"name": "web", "image": chart_image(), "imagePullPolicy": "Never",
                                    "command": ["python3", "-c",
                                                "import http.server as h\n"
                                                "class H(h.BaseHTTPRequestHandler):\n"
                                                "    def do_GET(self):\n"
                                                "        self.send_response(200); self.end_headers()\n"
                                                "        self.wfile.write(b'served from the pod')\n"
                                                "h.HTTPServer(('127.0.0.1', 8080), H).serve_forever()\n"]}]}}
    with applied(kube_client, namespace, [talker, web]):
        def restarted_and_running() -> bool:
            st = (kube_client.get(Pod, "talker", namespace=namespace).to_dict().get("status") or {})
            cs = (st.get("containerStatuses") or [{}])[0]
            return int(cs.get("restartCount", 0)) >= 1 and "running" in (cs.get("state") or {})

        wait(restarted_and_running, "talker restarted once and running again", timeout=90)
        prev = kubectl("logs", "-n", namespace, "talker", "--previous")
        assert prev.returncode == 0, prev.stderr
        assert prev.stdout == "".join(f"run-1 line-{i}\n" for i in range(10))
        wait(lambda: kubectl("logs", "-n", namespace, "talker").stdout.count("\n") >= 5, "5 lines of run 2")
        tail = kubectl("logs", "-n", namespace, "talker", "--tail", "3").stdout.splitlines()
        assert len(tail) == 3 and all(line.startswith("run-2 line-") for line in tail), tail
        numbers = [int(line.rpartition("-")[2]) for line in tail]
        assert numbers == list(range(numbers[0], numbers[0] + 3)), tail
        # -f keeps printing what the container writes after kubectl started
        follow = kubectl.popen("logs", "-f", "-n", namespace, "talker", "--tail", "1")
        guard = threading.Timer(30, follow.kill)  # a silent stream must not hang the test
        guard.start()
        try:
            assert follow.stdout is not None
            got = [follow.stdout.readline() for _ in range(6)]
        finally:
            guard.cancel()
            follow.kill()
            follow.wait(timeout=10)
        seen = [int(line.strip().rpartition("-")[2]) for line in got]
        assert all(line.startswith("run-2 line-") for line in got) and seen == sorted(seen) and \
            seen[-1] >= seen[0] + 5, got
        # exec: a command in the running container, its output and exit code back
        ex = kubectl("exec", "-n", namespace, "talker", "--", "sh", "-c", "cat /data/n; exit 3")
        assert ex.returncode == 3 and ex.stdout == "2\n", (ex.returncode, ex.stdout, ex.stderr)
        # port-forward: a port of the pod's own loopback on this machine's 127.0.0.1
        wait(lambda: running_1_of_1(kube_client.get(Pod, "web", namespace=namespace).to_dict()), "web Running")
        with port_forward(kubectl.popen, namespace, "pod/web", 8080) as local:
            body = wait(lambda: _get(f"http://127.0.0.1:{local}/"), "the pod's server through port-forward")
        assert body == b"served from the pod"


def _get(url: str) -> bytes | None:
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(url, timeout=5) as r:
            return bytes(r.read())
    except OSError:
        return None




def test_one_fake_host_path_serves_a_p5_and_two_trn2_nodes(kubelet_node: NodeFactory, kube_client: Client,
                                                             helm: Helm, wait: Wait) -> None:
    """One release of each chart, both with `fakeHost.path` = the one in-node path: every node shows its own
    instance type's devices (EFA 32 on the p5, 16 on each trn2; neuron 16 / neuroncore 64 on each trn2)."""
    nodes = {"p5.48xlarge": [kubelet_node("p5.48xlarge", runtime=CONTAINERD)],
             "trn2.48xlarge": [kubelet_node("trn2.48xlarge", runtime=CONTAINERD) for _ in range(2)]}
    flags = ("--set", "image.pullPolicy=Never", "--set", f"fakeHost.path={FAKE_HOST_IN_NODE}")
    helm("upgrade", "--install", "aws-efa-k8s-device-plugin", str(EFA_CHART), "--namespace", "kube-system", *flags)
    helm.seed(SEED_DEVICE_PLUGIN_INSTALL, NEURON_CHART, *flags)
    try:
        wait(lambda: ds_ready(kube_client, "kube-system", EFA_DS, 3), f"{EFA_DS} READY 3", timeout=300)
        wait(lambda: ds_ready(kube_client, "kube-system", NEURON_DP_DS, 2), f"{NEURON_DP_DS} READY 2", timeout=300)
        want = {n.name: (EFA_OF[itype], TRN2_DEVICES if itype.startswith("trn2") else 0,
                         TRN2_CORES_LNC2 if itype.startswith("trn2") else 0)
                for itype, group in nodes.items() for n in group}

        def seen() -> dict[str, tuple[int, int, int]]:
            return {name: (allocatable(kube_client, name, "vpc.amazonaws.com/efa"),
                           allocatable(kube_client, name, "aws.amazon.com/neuron"),
                           allocatable(kube_client, name, "aws.amazon.com/neuroncore")) for name in want}

        wait(lambda: seen() == want, f"allocatable (efa, neuron, neuroncore) per node = {want}", timeout=120)
        time.sleep(3)  # and it stays so (no node re-reads another's tree)
        assert seen() == want
    finally:
        helm("uninstall", "neuron-helm-chart", "--wait", "--timeout", "120s")
        helm("uninstall", "aws-efa-k8s-device-plugin", "--namespace", "kube-system", "--wait", "--timeout", "120s")
