"""The device plugin and the DRA driver of one accelerator on one node, as users deploy them: both charts' releases
under a real containerd + runc and the real kubelet, our image, the seeds' helm lines. The rule (docs/charts.md,
"Device plugin and DRA driver on one node"): the DRA driver wins; at any moment exactly one side serves the node.

What is checked, from the API server as kubectl shows it: the Node's allocatable for the device plugin's resource
(the kubelet's view of the plugin) and the devices in the DRA driver's ResourceSlices for the node. A sampler reads
both every 0.25 s for the whole test and fails it if it ever sees both at once. Expected counts are AWS facts: a
p5.48xlarge has 32 EFA devices; a trn2.48xlarge 16 Trainium2 devices, 64 logical cores at LNC 2.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from typing import Any

import pytest
from accel_rig.controlplane import ControlPlane
from accel_rig.nodelayout import CONTAINERD
from chart_render import EFA_CHART, NEURON_CHART, SEED_DEVICE_PLUGIN_INSTALL, SEED_DRA_INSTALL
from conftest import RealNode
from lightkube import Client
from lightkube.resources.core_v1 import Pod
from runtime_helpers import (
    REPO,
    Helm,
    allocatable,
    applied,
    delete_pod,
    ds_pod,
    ds_row,
    node_events,
    pod_ready,
    rig_flags,
    sampled,
    slice_devices,
    workload_docs,
)

pytestmark = pytest.mark.containerd

Wait = Callable[..., Any]
NodeFactory = Callable[..., RealNode]
P5_EFA, TRN2_DEVICES, TRN2_CORES_LNC2 = 32, 16, 64


@pytest.fixture
def helm(control_plane: ControlPlane, tmp_path: Any) -> Helm:
    return Helm(control_plane, tmp_path / "helm", hooks=True)


def test_neuron_device_plugin_and_dra_driver_on_one_trn2(kubelet_node: NodeFactory, kube_client: Client,
                                                         control_plane: ControlPlane, helm: Helm, namespace: str,
                                                         wait: Wait) -> None:
    """The seeds' two installs on one trn2.48xlarge: the device plugin release first, then the DRA release. The DRA
    driver serves and the device plugin stands down (not ready, a Node event). Deleting either pod, upgrading the
    DRA release and uninstalling it keep exactly one side serving; devices a running DRA claim holds are never
    advertised by the device plugin, and come back when that pod ends."""
    trn2 = kubelet_node("trn2.48xlarge", runtime=CONTAINERD)
    node, flags = trn2.name, rig_flags(trn2.kubelet)
    neuron = "aws.amazon.com/neuron"
    dp_ns, dp_ds, dra_ns, dra_ds = "kube-system", "neuron-device-plugin", "neuron-dra-driver", \
        "neuron-dra-driver-kubelet-plugin"
    helm.seed(SEED_DEVICE_PLUGIN_INSTALL, NEURON_CHART, *flags)
    try:
        wait(lambda: allocatable(kube_client, node, neuron) == TRN2_DEVICES, "neuron 16 from the device plugin",
             timeout=180)
        with sampled(control_plane, node, neuron, "neuron.aws.com") as sides:
            helm.seed(SEED_DRA_INSTALL, NEURON_CHART, *flags)
            wait(lambda: slice_devices(kube_client, node, "neuron.aws.com") == TRN2_DEVICES
                 and allocatable(kube_client, node, neuron) == 0, "the DRA driver serves, the device plugin not",
                 timeout=180)
            wait(lambda: ds_row(kube_client, dp_ns, dp_ds)["ready"] == 0, "the device plugin pod not ready")
            wait(lambda: node_events(kube_client, node, "DevicePluginStandingDown"), "a Node event says so")
            event = node_events(kube_client, node, "DevicePluginStandingDown")[0]
            assert "neuron.aws.com" in (event.message or ""), event.message

            # A running DRA workload holding 4 connected devices (the seed's 1x4 template).
            docs = workload_docs(REPO / "examples/neuron-dra/1x4-connected-neurons.yaml", "-co")
            with applied(kube_client, namespace, docs):
                pod_name = next(d["metadata"]["name"] for d in docs if d["kind"] == "Pod")
                wait(lambda: (p := kube_client.get(Pod, pod_name, namespace=namespace)).status is not None
                     and p.status.phase == "Running", "the 1x4 workload Running", timeout=120)

                # The DRA driver's pod deleted: the device plugin must not take over while it is re-created.
                since = time.monotonic()
                old = ds_pod(kube_client, dra_ns, dra_ds)
                assert old is not None
                delete_pod(kube_client, old)
                wait(lambda: (p := ds_pod(kube_client, dra_ns, dra_ds)) is not None
                     and p.metadata.uid != old.metadata.uid and pod_ready(p), "a new DRA driver pod ready",
                     timeout=120)
                time.sleep(3)  # a few node-status rounds (2 s on the rig) after it is back
                assert sides.plugin_max_since(since) == 0, "the device plugin advertised while the driver restarted"
                assert slice_devices(kube_client, node, "neuron.aws.com") == TRN2_DEVICES

                # The device plugin's pod deleted: it comes back standing down.
                since = time.monotonic()
                old = ds_pod(kube_client, dp_ns, dp_ds)
                assert old is not None
                delete_pod(kube_client, old)
                wait(lambda: (p := ds_pod(kube_client, dp_ns, dp_ds)) is not None
                     and p.metadata.uid != old.metadata.uid and p.status is not None and p.status.phase == "Running",
                     "a new device plugin pod running", timeout=120)
                time.sleep(4)
                assert sides.plugin_max_since(since) == 0

                # helm upgrade of the DRA release (a rolling update of its DaemonSet).
                since = time.monotonic()
                helm.seed(SEED_DRA_INSTALL, NEURON_CHART, *flags, "--set", "logLevel=DEBUG")
                wait(lambda: ds_row(kube_client, dra_ns, dra_ds)["up_to_date"] == 1
                     and pod_ready(ds_pod(kube_client, dra_ns, dra_ds)), "the upgraded DRA pod ready", timeout=180)
                time.sleep(3)
                assert sides.plugin_max_since(since) == 0

                # helm uninstall of the DRA release: the device plugin serves within seconds, without the 4 devices
                # the running claim holds (advertised unhealthy: not allocatable).
                t0 = time.monotonic()
                helm("uninstall", "neuron-helm-chart", "--namespace", dra_ns, "--wait", "--timeout", "120s")
                wait(lambda: allocatable(kube_client, node, neuron) == TRN2_DEVICES - 4
                     and allocatable(kube_client, node, "aws.amazon.com/neuroncore") == TRN2_CORES_LNC2 - 16,
                     "neuron 12 / neuroncore 48 from the device plugin", timeout=90)
                takeover = time.monotonic() - t0
                assert takeover < 25, f"{takeover:.1f}s: the driver did not leave cleanly (handoff hook)"
                assert slice_devices(kube_client, node, "neuron.aws.com") == 0
                wait(lambda: node_events(kube_client, node, "DevicePluginServing"), "a Node event says it serves")
                wait(lambda: pod_ready(ds_pod(kube_client, dp_ns, dp_ds)), "the device plugin pod ready")
                # The workload is deleted, but without its driver the kubelet cannot unprepare its claim: its devices
                # stay held. Installed again, the DRA driver serves the node (the device plugin stands down), the
                # kubelet unprepares the claim through it and the pod goes.
                kube_client.delete(Pod, pod_name, namespace=namespace, grace_period=1)
                time.sleep(5)
                assert allocatable(kube_client, node, neuron) == TRN2_DEVICES - 4, "a prepared claim's devices freed"
                helm.seed(SEED_DRA_INSTALL, NEURON_CHART, *flags)
                wait(lambda: slice_devices(kube_client, node, "neuron.aws.com") == TRN2_DEVICES
                     and allocatable(kube_client, node, neuron) == 0, "the DRA driver serves again", timeout=180)
                wait(lambda: not [p for p in kube_client.list(Pod, namespace=namespace)
                                  if p.metadata is not None and p.metadata.name == pod_name],
                     "the workload pod gone once its claim is unprepared", timeout=120)
            helm("uninstall", "neuron-helm-chart", "--namespace", dra_ns, "--wait", "--timeout", "120s")
            wait(lambda: allocatable(kube_client, node, neuron) == TRN2_DEVICES, "neuron 16 again", timeout=90)
        print(f"\n[figure] Neuron: helm uninstall of the DRA release to device-plugin capacity {takeover:.1f}s")
    finally:
        with contextlib.suppress(AssertionError):
            helm("uninstall", "neuron-helm-chart", "--namespace", dra_ns, "--wait", "--timeout", "120s")
        helm("uninstall", "neuron-helm-chart", "--wait", "--timeout", "120s")


def test_efa_device_plugin_and_dra_releases_on_one_p5(kubelet_node: NodeFactory, kube_client: Client,
                                                      control_plane: ControlPlane, helm: Helm, wait: Wait) -> None:
    """Two EFA releases on one p5.48xlarge (the issue's commands), in both orders: `efa-dra` (DRA driver) first, then
    `efa` (device plugin), which never advertises beside it (it had no plugins-registry mount before); deleting
    either pod or upgrading either release changes nothing; uninstalling `efa-dra` hands the 32 EFAs to the device
    plugin within seconds; installed again (now second), the DRA driver takes them back once the device plugin has
    drained; uninstalling `efa` leaves the DRA driver's slices alone."""
    p5 = kubelet_node("p5.48xlarge", runtime=CONTAINERD)
    node, flags = p5.name, rig_flags(p5.kubelet)
    efa = "vpc.amazonaws.com/efa"
    dp_ds, dra_ds = "aws-efa-k8s-device-plugin-daemonset", "aws-efa-k8s-device-plugin-dra-driver"
    dra_release = ("upgrade", "--install", "efa-dra", str(EFA_CHART), "-n", "kube-system", "--set",
                   "devicePlugin.enabled=false", "--set", "draDriver.enabled=true", *flags)
    dp_release = ("upgrade", "--install", "efa", str(EFA_CHART), "-n", "kube-system", *flags)

    def dra_serves() -> bool:
        return slice_devices(kube_client, node, "efa.aws.com") == P5_EFA and allocatable(kube_client, node, efa) == 0

    try:
        with sampled(control_plane, node, efa, "efa.aws.com") as sides:
            helm(*dra_release)
            wait(lambda: slice_devices(kube_client, node, "efa.aws.com") == P5_EFA, "32 EFAs in the slices",
                 timeout=180)
            since = time.monotonic()
            helm(*dp_release)
            wait(lambda: (p := ds_pod(kube_client, "kube-system", dp_ds)) is not None and p.status is not None
                 and p.status.phase == "Running", "the device plugin pod running", timeout=180)
            wait(lambda: node_events(kube_client, node, "DevicePluginStandingDown"), "a Node event says it stands down")
            assert sides.plugin_max_since(since) == 0, "the device plugin advertised beside the DRA driver"
            assert ds_row(kube_client, "kube-system", dp_ds)["ready"] == 0
            for ds in (dp_ds, dra_ds):
                since = time.monotonic()
                old = ds_pod(kube_client, "kube-system", ds)
                assert old is not None
                delete_pod(kube_client, old)
                wait(lambda ds=ds, old=old: (p := ds_pod(kube_client, "kube-system", ds)) is not None
                     and p.metadata.uid != old.metadata.uid and p.status is not None and p.status.phase == "Running",
                     f"a new {ds} pod running", timeout=120)
                time.sleep(4)
                assert sides.plugin_max_since(since) == 0, f"the device plugin advertised after deleting {ds}'s pod"
                wait(dra_serves, "32 EFAs in the slices, none allocatable from the device plugin")
            since = time.monotonic()
            helm(*dp_release, "--set", "logLevel=DEBUG")  # a rolling update of the device plugin
            wait(lambda: ds_row(kube_client, "kube-system", dp_ds)["up_to_date"] == 1, "the device plugin upgraded")
            time.sleep(4)
            assert sides.plugin_max_since(since) == 0 and dra_serves()

            t0 = time.monotonic()
            helm("uninstall", "efa-dra", "-n", "kube-system", "--wait", "--timeout", "120s")
            wait(lambda: allocatable(kube_client, node, efa) == P5_EFA, "efa 32 from the device plugin again",
                 timeout=60)
            takeover = time.monotonic() - t0
            # the pre-delete hook lets the driver remove its slices itself: well before the kubelet's 30 s wipe
            assert takeover < 25, f"{takeover:.1f}s: the driver did not leave cleanly (handoff hook)"
            assert slice_devices(kube_client, node, "efa.aws.com") == 0
            wait(lambda: pod_ready(ds_pod(kube_client, "kube-system", dp_ds)), "the device plugin pod ready")

            t0 = time.monotonic()
            helm(*dra_release)  # the other order: the device plugin serves, the DRA driver arrives
            wait(dra_serves, "the DRA driver serves again, the device plugin drained", timeout=120)
            takeback = time.monotonic() - t0
            helm("uninstall", "efa", "-n", "kube-system", "--wait", "--timeout", "120s")
            time.sleep(3)
            assert slice_devices(kube_client, node, "efa.aws.com") == P5_EFA, "the DRA driver's slices survive"
        print(f"\n[figure] EFA: helm uninstall of efa-dra to device-plugin capacity {takeover:.1f}s; "
              f"helm install of efa-dra beside the serving device plugin to DRA serving {takeback:.1f}s")
    finally:
        for release in ("efa-dra", "efa"):
            with contextlib.suppress(AssertionError):
                helm("uninstall", release, "-n", "kube-system", "--wait", "--timeout", "120s")
