"""The EFA and Neuron device plugins driven by the REAL kubelet (v1.37, built from the Go module proxy), on fake
hosts, with the fake CRI runtime recording what each container gets. No kubelet stand-in here: registration,
GetPreferredAllocation, Allocate, ListAndWatch health and allocatable are the kubelet's own doing.

Expected values come from AWS's descriptions, not from our code:
- p5.48xlarge has 32 EFA, "four EFA devices that share the same PCIe root with one GPU" (AWS EKS docs); a PCIe root
  is the first component of a device's resolved sysfs path;
- trn2.48xlarge: 16 devices in a 4x4 torus, device i at row i/4, column i%4, neighbours up/down/left/right with
  wrap-around; a connected group of 4 is one torus row; 8 physical cores per device, 4 logical at LNC 2 (64 per
  node) and 8 at LNC 1 (128); inside a container the runtime numbers cores from 0 across the devices it has.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from conftest import Daemon, RealNode
from kube_helpers import (
    EFA,
    NEURON,
    NEURONCORE,
    allocatable,
    capacity,
    create_pod,
    pcie_root_of_uverbs,
    pod_gone,
    pod_phase,
)
from lightkube import Client
from lightkube.resources.core_v1 import Pod

Wait = Callable[..., Any]
MakeNode = Callable[..., RealNode]
StartDaemon = Callable[..., Daemon]


def _index(path: str, prefix: str) -> int:
    m = re.fullmatch(rf"{re.escape(prefix)}(\d+)", path)
    assert m, f"{path!r} is not {prefix}N"
    return int(m.group(1))


def torus_neighbours(i: int) -> set[int]:
    row, col = divmod(i, 4)
    return {((row - 1) % 4) * 4 + col, ((row + 1) % 4) * 4 + col, row * 4 + (col - 1) % 4, row * 4 + (col + 1) % 4}


def test_efa_plugin_through_the_real_kubelet(kubelet_node: MakeNode, daemon: StartDaemon, kube_client: Client,
                                             namespace: str, wait: Wait) -> None:
    node = kubelet_node("p5.48xlarge")
    daemon("efa-device-plugin", "serve", "--metrics-port", "0", env=node.env())
    wait(lambda: allocatable(kube_client, node.name, EFA) == 32, "vpc.amazonaws.com/efa: 32 on the Node", timeout=60)

    create_pod(kube_client, namespace, "efa4", node.name, limits={EFA: "4"})
    wait(lambda: pod_phase(kube_client, namespace, "efa4") == "Running", "the EFA pod Running", timeout=90)
    (ctr,) = node.kubelet.containers("efa4", namespace)
    uverbs = [_index(p, "/dev/infiniband/uverbs") for p in ctr.device_paths]
    assert len(uverbs) == 4 and len(set(uverbs)) == 4, ctr.device_paths
    assert all(d["containerPath"] == d["hostPath"] for d in ctr.devices)
    # One PCIe root, and it is a whole GPU group: the root holds exactly these four EFA.
    roots = {pcie_root_of_uverbs(node.host.root, f"uverbs{u}") for u in uverbs}
    assert len(roots) == 1, roots
    all_uverbs = sorted(p.name for p in (node.host.root / "sys/class/infiniband_verbs").iterdir()
                        if p.name.startswith("uverbs"))
    same_root = {u for u in all_uverbs if pcie_root_of_uverbs(node.host.root, u) in roots}
    assert same_root == {f"uverbs{u}" for u in uverbs}

    # A port going DOWN makes that EFA Unhealthy: allocatable drops, capacity stays.
    ibdev = node.host.efa_ibdevs[-1]
    node.host.set_port_state(ibdev, "DOWN")
    wait(lambda: allocatable(kube_client, node.name, EFA) == 31, "allocatable 31 after a port went DOWN", timeout=30)
    assert capacity(kube_client, node.name, EFA) == 32
    node.host.set_port_state(ibdev, "ACTIVE")
    wait(lambda: allocatable(kube_client, node.name, EFA) == 32, "allocatable back to 32", timeout=30)
    assert pod_phase(kube_client, namespace, "efa4") == "Running"


def test_neuron_plugin_through_the_real_kubelet(kubelet_node: MakeNode, daemon: StartDaemon, kube_client: Client,
                                                namespace: str, wait: Wait) -> None:
    lnc2 = kubelet_node("trn2.48xlarge")
    lnc1 = kubelet_node("trn2.48xlarge", lnc=1)  # two kubelets on one machine at once
    for node in (lnc2, lnc1):
        daemon("neuron-device-plugin", "serve", "--metrics-port", "0", env=node.env())
    for node, cores in ((lnc2, 64), (lnc1, 128)):
        wait(lambda n=node, c=cores: (allocatable(kube_client, n.name, NEURON),
                                      allocatable(kube_client, n.name, NEURONCORE)) == (16, c),
             f"neuron 16 / neuroncore {cores} on {node.name}", timeout=60)

    create_pod(kube_client, namespace, "chips", lnc2.name, limits={NEURON: "4"})
    wait(lambda: pod_phase(kube_client, namespace, "chips") == "Running", "the neuron: 4 pod Running", timeout=90)
    create_pod(kube_client, namespace, "cores", lnc2.name, limits={NEURONCORE: "8"})
    wait(lambda: pod_phase(kube_client, namespace, "cores") == "Running", "the neuroncore: 8 pod Running", timeout=90)

    (chips,) = lnc2.kubelet.containers("chips", namespace)
    (cores,) = lnc2.kubelet.containers("cores", namespace)
    chip_devs = sorted(_index(p, "/dev/neuron") for p in chips.device_paths)
    core_devs = sorted(_index(p, "/dev/neuron") for p in cores.device_paths)
    # neuron: 4 is one torus row; its container numbers the 4 devices' 16 logical cores from 0.
    assert len(chip_devs) == 4 and len({d // 4 for d in chip_devs}) == 1, chip_devs
    assert chips.envs["NEURON_RT_VISIBLE_CORES"] == "0-15"
    # neuroncore: 8 at LNC 2 is two whole devices' cores, on torus neighbours, none of the chips pod's devices.
    assert len(core_devs) == 2 and core_devs[1] in torus_neighbours(core_devs[0]), core_devs
    assert not set(core_devs) & set(chip_devs)
    assert cores.envs["NEURON_RT_VISIBLE_CORES"] == "0-7"
    assert chips.envs.get("NEURON_LOGICAL_NC_CONFIG", "2") == "2"

    # No double counting: the other resource's view of what each pod holds is withdrawn (the kubelet counts a
    # device in allocatable while it is Healthy, allocated or not): the chips pod's 4 devices are 16 cores fewer,
    # the cores pod's 2 devices are 2 chips fewer.
    wait(lambda: (allocatable(kube_client, lnc2.name, NEURON), allocatable(kube_client, lnc2.name, NEURONCORE))
         == (16 - 2, 64 - 16), "allocatable lowered by what the other resource's pod holds", timeout=30)

    for pod in ("chips", "cores"):
        kube_client.delete(Pod, pod, namespace=namespace, grace_period=0)
    wait(lambda: pod_gone(kube_client, namespace, "chips") and pod_gone(kube_client, namespace, "cores"),
         "both pods deleted", timeout=60)
    wait(lambda: (allocatable(kube_client, lnc2.name, NEURON), allocatable(kube_client, lnc2.name, NEURONCORE))
         == (16, 64), "neuron 16 / neuroncore 64 back after deletion", timeout=60)
    # And the freed devices are usable again: the whole node in one pod.
    create_pod(kube_client, namespace, "all", lnc2.name, limits={NEURON: "16"})
    wait(lambda: pod_phase(kube_client, namespace, "all") == "Running", "the neuron: 16 pod Running", timeout=90)
    (whole,) = lnc2.kubelet.containers("all", namespace)
    assert sorted(_index(p, "/dev/neuron") for p in whole.device_paths) == list(range(16))
