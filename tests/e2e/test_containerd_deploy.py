"""Deployed as users deploy it: the project image (``make image``) run by the charts' DaemonSets under a real
containerd + runc and the real kubelet, installed with the seeds' ``helm upgrade --install`` lines, and workloads
whose own containers show the devices and environment they got.

The expected numbers are AWS facts, not our catalog's: a p5.48xlarge has 32 EFA devices (the EFA document's p5
listing), a trn2.48xlarge 16 Trainium2 devices of 8 physical NeuronCores each, so 64 logical cores at the default
Logical NeuronCore setting of 2 (the Neuron documentation); the uverbs character devices have major 231 and the
Neuron ones the fake host's sysfs ``dev`` files. The seeds' checks (``kubectl get ds``, ``kubectl get pods -l``,
the Node's allocatable, ``kubectl get resourceslice``) are read from the API server as kubectl reads them.
"""

from __future__ import annotations

import contextlib
import re
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from accel_rig.controlplane import ControlPlane
from accel_rig.nodelayout import CONTAINERD
from chart_render import EFA_CHART, NEURON_CHART, SEED_DEVICE_PLUGIN_INSTALL, SEED_DRA_INSTALL
from conftest import RealNode
from lightkube import Client
from lightkube.resources.apps_v1 import DaemonSet
from lightkube.resources.core_v1 import Pod
from lightkube.resources.resource_v1 import ResourceSlice
from runtime_helpers import (
    REPO,
    Helm,
    allocatable,
    applied,
    chart_image,
    container_view,
    device_plugin_pod,
    ds_ready,
    ds_row,
    pods_of,
    rig_flags,
    running_1_of_1,
    workload_docs,
)

pytestmark = pytest.mark.containerd

Wait = Callable[..., object]
NodeFactory = Callable[..., RealNode]
EFA_DS = "aws-efa-k8s-device-plugin-daemonset"
NEURON_DP_DS = "neuron-device-plugin"
NEURON_DRA_DS = "neuron-dra-driver-kubelet-plugin"
UVERBS_MAJOR = 231
#: AWS facts: EFA devices of a p5.48xlarge; Trainium2 devices of a trn2.48xlarge and their logical cores at LNC 2.
P5_EFA, TRN2_DEVICES, TRN2_CORES_LNC2 = 32, 16, 64


#: AWS Neuron-to-EFA table for trn2 (EFAMAP lookup/neuron): the PCI bus of the EFA (bus:00.0) next to each device.
TRN2_EFA_BUS = dict(enumerate(["c9", "b4", "b3", "ca", "6c", "57", "56", "6d", "98", "83", "82", "99", "f5", "e0",
                               "df", "f6"]))


def _pci_bus(host_root: Path, uverbs: str) -> str:
    """The PCI bus of an uverbs device, from where its sysfs class entry points (``.../0000:BB:00.0/...``)."""
    target = (host_root / "sys" / "class" / "infiniband_verbs" / uverbs).resolve()
    bdf = target.parent.parent.name
    return bdf.split(":")[1]


@pytest.fixture
def helm(control_plane: ControlPlane, tmp_path: Path) -> Helm:
    return Helm(control_plane, tmp_path)


def _slices(client: Client, node: str, driver: str) -> list[dict[str, object]]:
    return [s.to_dict() for s in client.list(ResourceSlice)
            if s.spec.nodeName == node and s.spec.driver == driver]


def _daemon_pod(client: Client, namespace: str, labels: dict[str, str]) -> dict[str, object] | None:
    pods = [p for p in pods_of(client, namespace, labels) if running_1_of_1(p)]
    return pods[0] if len(pods) == 1 else None


def _kill_container(node: RealNode, pod: dict[str, object]) -> None:
    """SIGKILL the pod's container through containerd, as an OOM kill or a crash would end it."""
    status = pod["status"]
    assert isinstance(status, dict)
    cid = status["containerStatuses"][0]["containerID"].removeprefix("containerd://")
    out = node.kubelet.containerd.ctr("tasks", "kill", "--signal", "SIGKILL", cid)
    assert out.returncode == 0, out.stderr


def _container_pid(node: RealNode, pod: dict[str, object]) -> str:
    """The machine PID of the pod's (first) container process, from containerd."""
    status = pod["status"]
    assert isinstance(status, dict)
    cid = status["containerStatuses"][0]["containerID"].removeprefix("containerd://")
    listing = node.kubelet.containerd.ctr("tasks", "list").stdout.splitlines()
    (pid,) = [line.split()[1] for line in listing if line.startswith(cid)]
    return pid


def _confinement(node: RealNode, pod: dict[str, object]) -> dict[str, str]:
    """The effective capabilities, no_new_privs, root mount mode and uid of the pod's container process, read from
    /proc of the machine (its PID from containerd)."""
    pid = _container_pid(node, pod)
    fields = dict(line.split(":\t", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines()
                  if ":\t" in line)
    root = next(line.split() for line in Path(f"/proc/{pid}/mountinfo").read_text().splitlines()
                if line.split()[4] == "/")
    return {"CapEff": fields["CapEff"].strip(), "NoNewPrivs": fields["NoNewPrivs"].strip(),
            "root": root[5].split(",")[0], "uid": fields["Uid"].split()[1]}


@pytest.fixture
def p5(kubelet_node: NodeFactory) -> RealNode:
    return kubelet_node("p5.48xlarge", runtime=CONTAINERD)


def test_efa_chart_under_containerd(kube_client: Client, helm: Helm, p5: RealNode, namespace: str,
                                    wait: Wait) -> None:
    """The EFA chart's DaemonSet runs our image; its checks give the seed's answers; a pod asking for 4 EFAs sees
    4 uverbs nodes in its own /dev; a killed daemon container is restarted and registers again; a node reboot
    brings it back; `helm uninstall` takes the resource away."""
    node = p5.name
    t0 = time.monotonic()
    helm("upgrade", "--install", "aws-efa-k8s-device-plugin", str(EFA_CHART), "--namespace", "kube-system",
         *rig_flags(p5.kubelet))
    try:
        wait(lambda: ds_ready(kube_client, "kube-system", EFA_DS), f"{EFA_DS} 1/1/1/1/1", timeout=180)
        install_to_ready = time.monotonic() - t0
        assert ds_row(kube_client, "kube-system", EFA_DS) == dict.fromkeys(
            ("desired", "current", "ready", "up_to_date", "available"), 1)
        pod = wait(lambda: _daemon_pod(kube_client, "kube-system", {"name": "aws-efa-k8s-device-plugin"}),
                   "kubectl get pods -l name=aws-efa-k8s-device-plugin: 1/1 Running")
        assert pod["spec"]["containers"][0]["image"] == chart_image()
        # The chart's securityContext, as the kernel applies it to the daemon's process.
        confined = _confinement(p5, pod)
        assert confined == {"CapEff": "0000000000000000", "NoNewPrivs": "1", "root": "ro", "uid": "0"}, confined
        # The image's glibc tunable reaches the daemon's own process (docs/benchmarks.md, "Kubelet restarts").
        # glibc (2.36) ends each tunable it parses with a NUL in the process's own environment block, which is what
        # /proc shows: a ':' between two tunables reads as a NUL there once glibc has taken both.
        environ = Path(f"/proc/{_container_pid(p5, pod)}/environ").read_bytes()
        assert re.search(rb"\0GLIBC_TUNABLES=glibc\.malloc\.tcache_count=0[:\0]glibc\.malloc\.arena_max=2\0",
                         b"\0" + environ), environ
        wait(lambda: allocatable(kube_client, node, "vpc.amazonaws.com/efa") == P5_EFA,
             f"vpc.amazonaws.com/efa: {P5_EFA} allocatable on {node}")

        # A workload with 4 EFAs: its own `ls -l /dev/infiniband`.
        with applied(kube_client, namespace, [device_plugin_pod("efa-4", "vpc.amazonaws.com/efa", 4, node)]):
            view = container_view(p5.kubelet, namespace, "efa-4", wait)
        uverbs = view.names("uverbs")
        assert len(uverbs) == 4, view.text
        assert all(view.devices[n][0] == UVERBS_MAJOR for n in uverbs), view.text

        # The daemon's container killed: the kubelet restarts it, and it registers again (allocatable comes back
        # after the kubelet drops the endpoint of a dead plugin).
        _kill_container(p5, pod)
        wait(lambda: (p := _daemon_pod(kube_client, "kube-system", {"name": "aws-efa-k8s-device-plugin"}))
             and p["status"]["containerStatuses"][0].get("restartCount", 0) >= 1, "the EFA plugin restarted",
             timeout=120)
        wait(lambda: p5.kubelet.pod_log("kube-system", pod["metadata"]["name"], "aws-efa-k8s-device-plugin")
             .count("registered") >= 2, "the restarted plugin's own log line: registered with the kubelet again")
        wait(lambda: allocatable(kube_client, node, "vpc.amazonaws.com/efa") == P5_EFA, "EFA allocatable again")

        # A reboot: kubelet and containerd restarted, every container gone; the DaemonSet pod runs a new container.
        before = _daemon_pod(kube_client, "kube-system", {"name": "aws-efa-k8s-device-plugin"})
        assert before is not None
        old_id = before["status"]["containerStatuses"][0]["containerID"]
        p5.kubelet.reboot()
        wait(lambda: (p := _daemon_pod(kube_client, "kube-system", {"name": "aws-efa-k8s-device-plugin"}))
             and p["status"]["containerStatuses"][0]["containerID"] != old_id,
             "the EFA plugin Running in a new container after the reboot", timeout=180)
        wait(lambda: allocatable(kube_client, node, "vpc.amazonaws.com/efa") == P5_EFA,
             "EFA allocatable after the reboot", timeout=120)
    finally:
        helm("uninstall", "aws-efa-k8s-device-plugin", "--namespace", "kube-system", "--wait", "--timeout", "120s")
    wait(lambda: allocatable(kube_client, node, "vpc.amazonaws.com/efa") == 0,
         "vpc.amazonaws.com/efa back to 0 after helm uninstall", timeout=120)
    print(f"\n[figure] EFA chart: helm install to DaemonSet Ready {install_to_ready:.1f}s")


def test_neuron_device_plugin_seed_install_under_containerd(kubelet_node: NodeFactory, kube_client: Client,
                                                           helm: Helm, namespace: str, wait: Wait) -> None:
    trn2 = kubelet_node("trn2.48xlarge", runtime=CONTAINERD)
    helm.seed(SEED_DEVICE_PLUGIN_INSTALL, NEURON_CHART, *rig_flags(trn2.kubelet))
    try:
        wait(lambda: ds_ready(kube_client, "kube-system", NEURON_DP_DS), f"{NEURON_DP_DS} READY 1", timeout=180)
        wait(lambda: allocatable(kube_client, trn2.name, "aws.amazon.com/neuron") == TRN2_DEVICES
             and allocatable(kube_client, trn2.name, "aws.amazon.com/neuroncore") == TRN2_CORES_LNC2,
             "neuron 16 / neuroncore 64 allocatable")
        with applied(kube_client, namespace,
                     [device_plugin_pod("neuron-4", "aws.amazon.com/neuron", 4, trn2.name)]):
            view = container_view(trn2.kubelet, namespace, "neuron-4", wait)
        neurons = view.names("neuron")
        assert len(neurons) == 4, view.text
        # Four whole devices at LNC 2: 4 logical cores each, 16 cores, named as one range.
        cores = view.env.get("NEURON_RT_VISIBLE_CORES", "")
        first, _, last = cores.partition("-")
        assert first.isdigit() and last.isdigit() and int(last) - int(first) + 1 == 16, view.env
    finally:
        helm("uninstall", "neuron-helm-chart", "--wait", "--timeout", "120s")
    wait(lambda: allocatable(kube_client, trn2.name, "aws.amazon.com/neuron") == 0, "neuron back to 0",
         timeout=120)


@pytest.fixture
def trn2_dra(kubelet_node: NodeFactory, kube_client: Client, helm: Helm, wait: Wait) -> Iterator[RealNode]:
    """A trn2.48xlarge containerd node with the Neuron DRA driver installed by the seed's command."""
    trn2 = kubelet_node("trn2.48xlarge", runtime=CONTAINERD)
    helm.seed(SEED_DRA_INSTALL, NEURON_CHART, *rig_flags(trn2.kubelet))
    try:
        yield trn2
    finally:
        with contextlib.suppress(AssertionError):  # the test may have uninstalled it already
            helm("uninstall", "neuron-helm-chart", "--namespace", "neuron-dra-driver", "--wait", "--timeout", "120s")


def test_neuron_dra_seed_install_claims_and_rolling_update(trn2_dra: RealNode, kube_client: Client, helm: Helm,
                                                          namespace: str, wait: Wait) -> None:
    node = trn2_dra.name
    wait(lambda: ds_ready(kube_client, "neuron-dra-driver", NEURON_DRA_DS), f"{NEURON_DRA_DS} READY 1",
         timeout=180)
    slices = wait(lambda: _slices(kube_client, node, "neuron.aws.com"), f"neuron.aws.com slices of {node}")
    assert sum(len(s["spec"]["devices"]) for s in slices) == TRN2_DEVICES
    # Only the pod publishes here (no daemon runs on the host): the slices came from inside the container.

    examples = REPO / "examples" / "neuron-dra"
    # The seed's three claims, one after the other (all-neurons takes every device).
    for example, want_devices, lnc in (("1x4-connected-neurons.yaml", 4, None), ("all-neurons.yaml", 16, None),
                                       ("all-neurons-lnc-1.yaml", 16, "1")):
        docs = workload_docs(examples / example, "-rt")
        pod = next(d["metadata"]["name"] for d in docs if d["kind"] == "Pod")
        with applied(kube_client, namespace, docs):
            view = container_view(trn2_dra.kubelet, namespace, pod, wait, timeout=180)
        assert len(view.names("neuron")) == want_devices, (example, view.text)
        assert view.env.get("NEURON_RT_VISIBLE_CORES"), (example, view.env)
        if lnc is not None:
            assert view.env.get("NEURON_LOGICAL_NC_CONFIG") == lnc, (example, view.env)
        wait(lambda p=pod: not list(kube_client.list(Pod, namespace=namespace, fields={"metadata.name": p})),
             f"{pod} deleted", timeout=60)

    # helm upgrade to a new image tag while a claim is prepared: the new pod serves the unprepare.
    image = chart_image()
    new_tag = image.rsplit(":", 1)[1] + "-rollout"
    tagged = trn2_dra.kubelet.containerd.ctr("images", "tag", image, image.rsplit(":", 1)[0] + ":" + new_tag)
    assert tagged.returncode == 0, tagged.stderr
    docs = workload_docs(examples / "1x4-connected-neurons.yaml", "-upd")
    pod = next(d["metadata"]["name"] for d in docs if d["kind"] == "Pod")
    cdi_dir = trn2_dra.kubelet.layout.cdi_root
    with applied(kube_client, namespace, docs):
        container_view(trn2_dra.kubelet, namespace, pod, wait, timeout=180)
        specs_before = sorted(p.name for p in cdi_dir.glob("*.json"))
        assert specs_before, "no CDI spec for the prepared claim"
        old = {p["metadata"]["name"] for p in pods_of(kube_client, "neuron-dra-driver", {})}
        helm("upgrade", "neuron-helm-chart", str(REPO / "charts" / "neuron-helm-chart"), "--namespace",
             "neuron-dra-driver", "--reuse-values", "--set", f"image.tag={new_tag}")
        wait(lambda: (ds := kube_client.get(DaemonSet, NEURON_DRA_DS, namespace="neuron-dra-driver").to_dict())
             and ds["status"].get("updatedNumberScheduled") == 1 and ds["status"].get("numberAvailable") == 1
             and not old & {p["metadata"]["name"] for p in pods_of(kube_client, "neuron-dra-driver", {})},
             "the DRA DaemonSet rolled to the new tag", timeout=180)
    # The pod is deleted: the kubelet asks the NEW driver pod to unprepare; its spec goes.
    wait(lambda: not list(kube_client.list(Pod, namespace=namespace, fields={"metadata.name": pod})),
         f"{pod} deleted", timeout=60)
    wait(lambda: not [p for p in cdi_dir.glob("*.json") if p.name in specs_before],
         "the claim's CDI spec removed by the new driver pod", timeout=60)
    (new_pod,) = pods_of(kube_client, "neuron-dra-driver", {})
    assert new_pod["spec"]["containers"][0]["image"].endswith(":" + new_tag)

    # helm uninstall: the slices go.
    helm("uninstall", "neuron-helm-chart", "--namespace", "neuron-dra-driver", "--wait", "--timeout", "120s")
    wait(lambda: not _slices(kube_client, node, "neuron.aws.com"), "slices removed after helm uninstall",
         timeout=120)


def test_efa_dra_claim_aligned_with_neuron_devices(trn2_dra: RealNode, kube_client: Client, helm: Helm,
                                                   namespace: str, wait: Wait) -> None:
    node = trn2_dra.name
    helm("upgrade", "--install", "aws-efa-k8s-device-plugin", str(EFA_CHART), "--namespace", "kube-system",
         "--set", "devicePlugin.enabled=false", "--set", "draDriver.enabled=true", *rig_flags(trn2_dra.kubelet))
    try:
        wait(lambda: _slices(kube_client, node, "efa.aws.com") and _slices(kube_client, node, "neuron.aws.com"),
             "EFA and Neuron slices", timeout=180)
        docs = workload_docs(REPO / "examples" / "efa-dra" / "trn2-4-neurons-with-their-efa.yaml", "-rt")
        pod = next(d["metadata"]["name"] for d in docs if d["kind"] == "Pod")
        with applied(kube_client, namespace, docs):
            view = container_view(trn2_dra.kubelet, namespace, pod, wait, timeout=180)
        neurons, uverbs = view.names("neuron"), view.names("uverbs")
        assert len(neurons) == 4 and len(uverbs) == 4, view.text
        # The AWS Neuron-to-EFA table: the EFAs the container got are exactly those wired to its Neuron devices
        # (each uverbs node's PCI bus read from the node's sysfs, as on a real host).
        wired = {TRN2_EFA_BUS[int(n.removeprefix("neuron"))] for n in neurons}
        got = {_pci_bus(trn2_dra.kubelet.layout.host_root, u) for u in uverbs}
        assert got == wired, (neurons, uverbs, got, wired)
    finally:
        with contextlib.suppress(AssertionError):
            helm("uninstall", "aws-efa-k8s-device-plugin", "--namespace", "kube-system", "--wait", "--timeout",
                 "120s")
