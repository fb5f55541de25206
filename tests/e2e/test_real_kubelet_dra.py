"""The Neuron DRA driver driven by the REAL kubelet (v1.37) on a fake trn2.48xlarge, with kube-scheduler allocating
and the fake CRI runtime recording the CDI device names each container gets. No kubelet stand-in: registration,
NodePrepareResources/NodeUnprepareResources, the health stream, the slice wipes at kubelet start and 30 s after a
driver goes away are all the kubelet's own.

Facts the assertions use (not our code): trn2.48xlarge has 16 devices in a 4x4 torus (device i in row i/4) and a
connected group of 4 is one row; LNC 2 gives 4 logical cores per device, LNC 1 gives 8; a CDI device name is
``<kind>=<device name>`` and the runtime resolves it from a spec file in its CDI directory.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from accel_rig.controlplane import ControlPlane
from conftest import REPO_ROOT, Daemon, RealNode
from kube_helpers import cdi_edits, create_pod, pod_events, pod_gone, pod_phase
from lightkube import ApiError, Client, codecs
from lightkube.resources.core_v1 import Pod
from lightkube.resources.resource_v1 import ResourceClaimTemplate, ResourceSlice

Wait = Callable[..., Any]
MakeNode = Callable[..., RealNode]
StartDaemon = Callable[..., Daemon]

DRIVER = "neuron.aws.com"
EXAMPLES = REPO_ROOT / "examples" / "neuron-dra"


@pytest.fixture(scope="module")
def device_class(control_plane: ControlPlane, kube_client: Client) -> None:
    """The chart's DeviceClass ``neuron.aws.com`` (rendered with helm, as users install it)."""
    out = subprocess.run([str(control_plane.helm), "template", "neuron", str(REPO_ROOT / "charts/neuron-helm-chart"),
                          "--set", "draDriver.enabled=true", "--set", "devicePlugin.enabled=false",
                          "--set", "npd.enabled=false"], capture_output=True, text=True, timeout=120, check=True)
    (doc,) = [d for d in yaml.safe_load_all(out.stdout) if d and d.get("kind") == "DeviceClass"]
    try:
        kube_client.create(codecs.from_dict(doc))
    except ApiError as exc:
        if exc.status.code != 409:
            raise


def seed_template(name: str) -> dict[str, Any]:
    (doc,) = [d for d in yaml.safe_load_all((EXAMPLES / f"{name}.yaml").read_text())
              if d["kind"] == "ResourceClaimTemplate"]
    return dict(doc)


def apply_template(client: Client, namespace: str, doc: dict[str, Any]) -> str:
    doc = json.loads(json.dumps(doc))
    doc["metadata"]["namespace"] = namespace
    client.create(ResourceClaimTemplate.from_dict(doc))  # type: ignore[call-overload]
    return str(doc["metadata"]["name"])


def start_driver(daemon: StartDaemon, node: RealNode) -> Daemon:
    return daemon("neuron-dra-driver", "serve", "--metrics-port", "0", "--healthcheck-port", "-1",
                  "--rescan-interval", "1", env=node.env(POD_UID="dra-pod-1"))


def node_slices(client: Client, node: str) -> list[ResourceSlice]:
    return list(client.list(ResourceSlice, fields={"spec.nodeName": node, "spec.driver": DRIVER}))


def slice_devices(client: Client, node: str) -> int:
    return sum(len(s.spec.devices or []) for s in node_slices(client, node))


def registered(driver: Daemon) -> bool:
    return "kubelet registered the DRA plugin" in driver.tail(200)


def claim_uid(names: tuple[str, ...]) -> str:
    uids = {re.match(r"[^=]+=([0-9a-f-]{36})-", n).group(1) for n in names}  # type: ignore[union-attr]
    assert len(uids) == 1, names
    return uids.pop()


def neuron_indices(paths: set[str]) -> list[int]:
    return sorted(int(p.removeprefix("/dev/neuron")) for p in paths)


def run_pod(client: Client, namespace: str, pod: str, node: RealNode, template: str, wait: Wait) -> Any:
    create_pod(client, namespace, pod, node.name, claims=[("neurons", template)])
    wait(lambda: pod_phase(client, namespace, pod) == "Running", f"{pod} Running", timeout=120)
    (ctr,) = node.kubelet.containers(pod, namespace)
    return ctr


def test_the_seed_claims_run_and_clean_up(kubelet_node: MakeNode, daemon: StartDaemon, kube_client: Client,
                                          device_class: None, namespace: str, wait: Wait) -> None:
    node = kubelet_node("trn2.48xlarge")
    driver = start_driver(daemon, node)
    wait(lambda: slice_devices(kube_client, node.name) == 16, "16 devices published", timeout=60)
    wait(lambda: registered(driver), "the kubelet's registration of the driver", timeout=30)
    cdi = node.kubelet.layout.cdi_root

    expected = {  # template -> (devices, NEURON_RT_VISIBLE_CORES, NEURON_LOGICAL_NC_CONFIG: set only by a claim config)
        "1x4-connected-neurons": (4, "0-15", None),
        "all-neurons": (16, "0-63", None),
        "all-neurons-lnc-1": (16, "0-127", "1"),
    }
    for template, (count, cores, lnc) in expected.items():
        apply_template(kube_client, namespace, seed_template(template))
        pod = f"{template}-pod"
        ctr = run_pod(kube_client, namespace, pod, node, template, wait)
        assert ctr.cdi_devices and not ctr.devices, "DRA devices reach the runtime as CDI names only"
        nodes, env = cdi_edits(cdi, ctr.cdi_devices)
        devs = neuron_indices(nodes)
        assert len(devs) == count, devs
        if count == 4:
            assert len({d // 4 for d in devs}) == 1, f"not one torus row: {devs}"
        assert env["NEURON_RT_VISIBLE_CORES"] == cores
        assert env.get("NEURON_LOGICAL_NC_CONFIG") == lnc
        uid = claim_uid(ctr.cdi_devices)
        spec = cdi / f"k8s.neuron.aws.com-claim_{uid}.json"
        assert spec.exists()
        kube_client.delete(Pod, pod, namespace=namespace, grace_period=0)
        wait(lambda p=pod: pod_gone(kube_client, namespace, p), f"{pod} deleted", timeout=60)
        wait(lambda s=spec: not s.exists(), f"the kubelet unprepared the claim ({spec.name} removed)", timeout=60)


def test_a_bad_neuron_config_shows_the_drivers_message_in_pod_events(
        kubelet_node: MakeNode, daemon: StartDaemon, kube_client: Client, device_class: None, namespace: str,
        wait: Wait) -> None:
    node = kubelet_node("trn2.48xlarge")
    start_driver(daemon, node)
    wait(lambda: slice_devices(kube_client, node.name) == 16, "16 devices published", timeout=60)
    doc = seed_template("all-neurons-lnc-1")
    doc["metadata"]["name"] = "lnc-3"
    doc["spec"]["spec"]["devices"]["config"][0]["opaque"]["parameters"]["logicalNeuronCore"] = 3
    apply_template(kube_client, namespace, doc)
    create_pod(kube_client, namespace, "bad", node.name, claims=[("neurons", "lnc-3")])
    events = wait(lambda: [m for r, m in pod_events(kube_client, namespace, "bad")
                           if "logicalNeuronCore must be 1 or 2" in m], "the driver's message in the pod's events",
                  timeout=120)
    assert "3" in events[0]
    assert pod_phase(kube_client, namespace, "bad") == "Pending"
    assert node.kubelet.containers("bad", namespace) == []


def test_slice_wipes_restarts_and_health(kubelet_node: MakeNode, daemon: StartDaemon, kube_client: Client,
                                         device_class: None, namespace: str, wait: Wait) -> None:
    node = kubelet_node("trn2.48xlarge")
    driver = start_driver(daemon, node)
    wait(lambda: slice_devices(kube_client, node.name) == 16, "16 devices published", timeout=60)
    apply_template(kube_client, namespace, seed_template("1x4-connected-neurons"))
    ctr = run_pod(kube_client, namespace, "held", node, "1x4-connected-neurons", wait)
    held, _ = cdi_edits(node.kubelet.layout.cdi_root, ctr.cdi_devices)

    # The kubelet wipes this node's slices when it starts; the driver publishes them again.
    before = {s.metadata.uid for s in node_slices(kube_client, node.name)}
    node.kubelet.restart_kubelet()
    node.kubelet.wait_ready(timeout=120)
    wait(lambda: slice_devices(kube_client, node.name) == 16
         and not before & {s.metadata.uid for s in node_slices(kube_client, node.name)},
         "new slices after the kubelet's start-up wipe", timeout=60)
    assert pod_phase(kube_client, namespace, "held") == "Running"
    assert len(node.kubelet.containers("held", namespace)) == 1, "the kubelet restart re-created the container"

    # Device health reaches the Pod status (allocatedResourcesStatus), through the kubelet's health stream.
    victim = neuron_indices(held)[0]
    node.host.remove_dev_node(f"/dev/neuron{victim}")

    def health_of_victim() -> str | None:
        status = kube_client.get(Pod, "held", namespace=namespace).to_dict().get("status", {})
        for cs in status.get("containerStatuses", []):
            for res in cs.get("allocatedResourcesStatus", []) or []:
                for r in res.get("resources", []) or []:
                    # The kubelet names a device by the CDI device ID the driver returned for it.
                    if r.get("resourceID", "").endswith(f"-neuron-device-{victim}"):
                        return str(r.get("health"))
        return None

    wait(lambda: health_of_victim() == "Unhealthy", f"neuron{victim} Unhealthy in the Pod status", timeout=90)
    node.host.restore_dev_node(f"/dev/neuron{victim}")
    wait(lambda: health_of_victim() == "Healthy", f"neuron{victim} Healthy again in the Pod status", timeout=90)

    # The driver goes away: 30 s later the kubelet removes its slices. Back, it publishes them again and a new
    # claim still avoids the devices the running pod holds (they stayed prepared across both restarts).
    assert driver.stop(signal.SIGKILL) != 0
    wait(lambda: slice_devices(kube_client, node.name) == 0, "the kubelet's wipe 30 s after the driver left",
         timeout=90)
    start_driver(daemon, node)
    wait(lambda: slice_devices(kube_client, node.name) == 16, "slices published again", timeout=60)
    second = run_pod(kube_client, namespace, "second", node, "1x4-connected-neurons", wait)
    again, _ = cdi_edits(node.kubelet.layout.cdi_root, second.cdi_devices)
    assert not held & again, (held, again)
    assert (node.kubelet.layout.cdi_root / f"k8s.neuron.aws.com-claim_{claim_uid(ctr.cdi_devices)}.json").exists()


# neuron.md §3, "EFA BDF per Neuron device" for trn2/trn2e/trn2u (bus:00.0, domain 0000): Neuron device -> its EFA.
TRN2_EFA_BUS = {0: "c9", 1: "b4", 2: "b3", 3: "ca", 4: "6c", 5: "57", 6: "56", 7: "6d",
                8: "98", 9: "83", 10: "82", 11: "99", 12: "f5", 13: "e0", 14: "df", 15: "f6"}


def test_neuron_devices_with_their_efa_in_one_claim(control_plane: ControlPlane, kubelet_node: MakeNode,
                                                    daemon: StartDaemon, kube_client: Client, device_class: None,
                                                    namespace: str, wait: Wait) -> None:
    """Example (c) of examples/efa-dra: both DRA drivers on one node, one claim, one torus row and its EFAs."""
    out = subprocess.run([str(control_plane.helm), "template", "efa",
                          str(REPO_ROOT / "charts/aws-efa-k8s-device-plugin"), "--set", "draDriver.enabled=true",
                          "--set", "devicePlugin.enabled=false"], capture_output=True, text=True, timeout=120,
                         check=True)
    (doc,) = [d for d in yaml.safe_load_all(out.stdout) if d and d.get("kind") == "DeviceClass"]
    try:
        kube_client.create(codecs.from_dict(doc))
    except ApiError as exc:
        if exc.status.code != 409:
            raise
    node = kubelet_node("trn2.48xlarge")
    start_driver(daemon, node)
    daemon("efa-dra-driver", "serve", "--metrics-port", "0", "--healthcheck-port", "-1",
           env=node.env(POD_UID="efa-pod-1"))
    wait(lambda: slice_devices(kube_client, node.name) == 16, "16 Neuron devices published", timeout=60)
    wait(lambda: len(list(kube_client.list(ResourceSlice, fields={"spec.nodeName": node.name,
                                                                  "spec.driver": "efa.aws.com"}))) > 0,
         "EFA devices published", timeout=60)
    (tmpl,) = [d for d in yaml.safe_load_all((REPO_ROOT / "examples/efa-dra/trn2-4-neurons-with-their-efa.yaml")
                                             .read_text()) if d["kind"] == "ResourceClaimTemplate"]
    name = apply_template(kube_client, namespace, tmpl)
    create_pod(kube_client, namespace, "aligned", node.name, claims=[("devices", name)])
    wait(lambda: pod_phase(kube_client, namespace, "aligned") == "Running", "aligned Running", timeout=120)
    (ctr,) = node.kubelet.containers("aligned", namespace)
    nodes, _ = cdi_edits(node.kubelet.layout.cdi_root, ctr.cdi_devices)
    neurons = sorted(int(p.removeprefix("/dev/neuron")) for p in nodes if p.startswith("/dev/neuron"))
    uverbs = sorted(p.removeprefix("/dev/infiniband/") for p in nodes if p.startswith("/dev/infiniband/uverbs"))
    assert len(neurons) == 4 and len({d // 4 for d in neurons}) == 1, neurons
    buses = {Path(os.path.realpath(node.host.root / "sys/class/infiniband_verbs" / u / "device")).name
             for u in uverbs}
    assert buses == {f"0000:{TRN2_EFA_BUS[d]}:00.0" for d in neurons}, (neurons, buses)
