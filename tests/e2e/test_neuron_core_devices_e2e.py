"""NeuronCores as DRA devices (chart ``draDriver.coreDevices.enabled``, driver ``CORE_DEVICES=on``) with the REAL
kube-scheduler allocating and the REAL kubelet (v1.37) preparing, on a fake trn2.48xlarge; the fake CRI runtime
records the CDI device names each container gets, resolved here from the driver's spec files.

- A chip is never split between a whole-chip claim and a core claim, and it is the scheduler that says so (the
  shared counters): a whole-chip pod for a chip one of whose cores runs a pod stays Unschedulable until that pod
  goes, and the reverse.
- A core claim's container gets its chip's ``/dev/neuron<i>`` and exactly its cores in
  ``NEURON_RT_VISIBLE_CORES``; two cores of one chip (``count: 2`` + ``matchAttribute deviceId``) stay on one chip;
  a device-plugin pod spec asking ``aws.amazon.com/neuroncore: 2`` runs unchanged (extendedResourceName).

Facts the assertions use (not our code): a Trainium2 chip has 8 physical cores, 4 logical ones at the default LNC 2;
the runtime in a container numbers the cores of its ``/dev/neuron*`` nodes from 0; a pod the scheduler cannot place
gets ``PodScheduled=False`` with reason ``Unschedulable``.
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from accel_rig.controlplane import ControlPlane
from conftest import REPO_ROOT, Daemon, RealNode
from dra_support import NEURON, DriverProcess, chart_objects, pod_bound_kubeconfig
from dra_support import wait_published as supported_wait_published
from kube_helpers import allocatable, cdi_edits, create_pod, pod_gone, pod_phase
from lightkube import ApiError, Client, codecs
from lightkube.resources.core_v1 import Node, Pod
from lightkube.resources.resource_v1 import DeviceClass, ResourceClaim, ResourceSlice

from accel_core.fakehost import build_host
from accel_core.podresources import PodResourcesClient
from neuron_dra import NEURON_RESOURCE, NEURONCORE_RESOURCE
from neuron_dra.dra.cores import CHIP_CLASS_SELECTOR, CORE_CLASS_SELECTOR

Wait = Callable[..., Any]
MakeNode = Callable[..., RealNode]
StartDaemon = Callable[..., Daemon]

DRIVER = "neuron.aws.com"
CHIPS, CORES = 16, 64  # trn2.48xlarge: 16 chips x 4 logical cores at LNC 2


@pytest.fixture(scope="module")
def classes(control_plane: ControlPlane, kube_client: Client) -> Iterator[None]:
    """The chart's DeviceClasses with core devices and extended resources on, as users install them."""
    run = subprocess.run([str(control_plane.helm), "template", "x", str(REPO_ROOT / "charts/neuron-helm-chart"),
                          "--set", "draDriver.enabled=true", "--set", "devicePlugin.enabled=false",
                          "--set", "npd.enabled=false", "--set", "draDriver.coreDevices.enabled=true",
                          "--set", "draDriver.extendedResource=true"],
                         capture_output=True, text=True, timeout=120, check=True)
    docs = [d for d in yaml.safe_load_all(run.stdout) if d and d.get("kind") == "DeviceClass"]
    assert {d["metadata"]["name"]: d["spec"]["selectors"][0]["cel"]["expression"] for d in docs} == {
        "neuron.aws.com": CHIP_CLASS_SELECTOR, "neuroncore.aws.com": CORE_CLASS_SELECTOR}
    for doc in docs:
        with contextlib.suppress(ApiError):
            kube_client.delete(DeviceClass, doc["metadata"]["name"])
        kube_client.create(codecs.from_dict(doc))
    yield
    for doc in docs:
        with contextlib.suppress(ApiError):
            kube_client.delete(DeviceClass, doc["metadata"]["name"])


def template(client: Client, namespace: str, name: str, device_class: str, *, chip: int | None = None,
             count: int = 1, same_chip: bool = False) -> str:
    selectors = ([{"cel": {"expression": f"device.attributes['{DRIVER}'].deviceId == {chip}"}}]
                 if chip is not None else [])
    spec: dict[str, Any] = {"devices": {"requests": [{"name": "neurons", "exactly": {
        "deviceClassName": device_class, "count": count, **({"selectors": selectors} if selectors else {})}}]}}
    if same_chip:
        spec["devices"]["constraints"] = [{"requests": ["neurons"], "matchAttribute": f"{DRIVER}/deviceId"}]
    client.create(codecs.from_dict({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
                                    "metadata": {"name": name, "namespace": namespace}, "spec": {"spec": spec}}))
    return name


def ready_node(kubelet_node: MakeNode, daemon: StartDaemon, client: Client, wait: Wait) -> RealNode:
    node = kubelet_node("trn2.48xlarge")
    driver = daemon("neuron-dra-driver", "serve", "--metrics-port", "0", "--healthcheck-port", "-1",
                    "--rescan-interval", "1", env=node.env(POD_UID="cores-pod", CORE_DEVICES="on"))

    wait(lambda: len(published(client, node.name)) == CHIPS + CORES, f"{CHIPS} chips and {CORES} cores published",
         timeout=60)
    wait(lambda: "kubelet registered the DRA plugin" in driver.tail(200), "the kubelet's registration", timeout=30)
    return node


def published(client: Client, node: str) -> set[str]:
    """The names of the devices the driver publishes for ``node``."""
    return {d.name for s in client.list(ResourceSlice, fields={"spec.nodeName": node, "spec.driver": DRIVER})
            for d in s.spec.devices or []}


def run(client: Client, namespace: str, pod: str, node: RealNode, tmpl: str, wait: Wait) -> None:
    create_pod(client, namespace, pod, node.name, claims=[("neurons", tmpl)])
    wait(lambda: pod_phase(client, namespace, pod) == "Running", f"{pod} Running", timeout=120)


def allocated(client: Client, namespace: str, pod: str) -> list[str]:
    statuses = client.get(Pod, pod, namespace=namespace).to_dict()["status"]
    name = (statuses.get("resourceClaimStatuses") or [{}])[0].get("resourceClaimName") or (
        statuses.get("extendedResourceClaimStatus") or {}).get("resourceClaimName")
    assert name, f"pod {pod} has no claim"
    claim = client.get(ResourceClaim, name, namespace=namespace).to_dict()
    return sorted(r["device"] for r in claim["status"]["allocation"]["devices"]["results"])


def core_set(text: str) -> set[int]:
    """``NEURON_RT_VISIBLE_CORES`` syntax (ranges and comma lists) as the set of cores it names."""
    out: set[int] = set()
    for part in text.split(","):
        first, _, last = part.partition("-")
        out.update(range(int(first), int(last or first) + 1))
    return out


def local_cores(devices: list[str]) -> set[int]:
    """The logical core indices in core device names (``neuron-device-9-core-2`` -> 2)."""
    return {int(d.rsplit("-", 1)[1]) for d in devices}


def edits(node: RealNode, namespace: str, pod: str) -> tuple[set[str], dict[str, str]]:
    (ctr,) = node.kubelet.containers(pod, namespace)
    assert ctr.cdi_devices and not ctr.devices, "DRA devices reach the runtime as CDI names only"
    return cdi_edits(node.kubelet.layout.cdi_root, ctr.cdi_devices)


def unschedulable(client: Client, namespace: str, pod: str) -> bool:
    conditions = client.get(Pod, pod, namespace=namespace).to_dict().get("status", {}).get("conditions") or []
    return any(c["type"] == "PodScheduled" and c["status"] == "False" and c.get("reason") == "Unschedulable"
               for c in conditions)


def stays_pending(client: Client, namespace: str, pod: str, wait: Wait, seconds: float = 8.0) -> None:
    """The scheduler said Unschedulable, and the pod is still unbound ``seconds`` later."""
    wait(lambda: unschedulable(client, namespace, pod), f"{pod} Unschedulable", timeout=60)
    time.sleep(seconds)
    assert not client.get(Pod, pod, namespace=namespace).spec.nodeName, f"{pod} was bound"  # type: ignore[union-attr]


def delete(client: Client, namespace: str, pod: str, wait: Wait) -> None:
    client.delete(Pod, pod, namespace=namespace, grace_period=0)
    wait(lambda: pod_gone(client, namespace, pod), f"{pod} deleted", timeout=60)


def test_a_chip_goes_whole_or_by_cores_never_both(kubelet_node: MakeNode, daemon: StartDaemon, kube_client: Client,
                                                  classes: None, namespace: str, wait: Wait) -> None:
    node = ready_node(kubelet_node, daemon, kube_client, wait)
    core_of_5 = template(kube_client, namespace, "core-of-5", "neuroncore.aws.com", chip=5)
    chip_5 = template(kube_client, namespace, "chip-5", "neuron.aws.com", chip=5)

    # a core of chip 5 runs: the container has /dev/neuron5 and that one core
    run(kube_client, namespace, "core", node, core_of_5, wait)
    [core] = allocated(kube_client, namespace, "core")
    assert core.startswith("neuron-device-5-core-"), core
    nodes, env = edits(node, namespace, "core")
    assert nodes == {"/dev/neuron5"}
    assert env == {"NEURON_RT_VISIBLE_CORES": core.rsplit("-", 1)[1]}  # chip 5 is the container's only chip

    # chip 5 whole: the scheduler refuses it while the core runs, and gives it once the core's pod is gone
    create_pod(kube_client, namespace, "whole", node.name, claims=[("neurons", chip_5)])
    stays_pending(kube_client, namespace, "whole", wait)
    delete(kube_client, namespace, "core", wait)
    wait(lambda: pod_phase(kube_client, namespace, "whole") == "Running", "whole Running once the core is free",
         timeout=120)
    assert allocated(kube_client, namespace, "whole") == ["neuron-device-5"]
    nodes, env = edits(node, namespace, "whole")
    assert nodes == {"/dev/neuron5"} and env == {"NEURON_RT_VISIBLE_CORES": "0-3"}

    # the reverse: no core of chip 5 while the whole chip runs
    create_pod(kube_client, namespace, "core-again", node.name, claims=[("neurons", core_of_5)])
    stays_pending(kube_client, namespace, "core-again", wait)
    delete(kube_client, namespace, "whole", wait)
    wait(lambda: pod_phase(kube_client, namespace, "core-again") == "Running", "core-again Running", timeout=120)
    [again] = allocated(kube_client, namespace, "core-again")
    assert again.startswith("neuron-device-5-core-"), again


def test_cores_of_one_chip_and_device_plugin_pod_specs(kubelet_node: MakeNode, daemon: StartDaemon,
                                                       kube_client: Client, classes: None, namespace: str,
                                                       wait: Wait) -> None:
    node = ready_node(kubelet_node, daemon, kube_client, wait)
    # every chip but chip 9 is taken whole, and one core of chip 9 too: 3 cores are left, all on chip 9
    template(kube_client, namespace, "one-core-of-9", "neuroncore.aws.com", chip=9)
    run(kube_client, namespace, "first", node, "one-core-of-9", wait)
    [first] = allocated(kube_client, namespace, "first")
    template(kube_client, namespace, "fifteen-chips", "neuron.aws.com", count=15)
    run(kube_client, namespace, "chips", node, "fifteen-chips", wait)
    assert "neuron-device-9" not in allocated(kube_client, namespace, "chips")

    # two cores of one chip: on chip 9, neither of them the one taken; the container sees chip 9's cores 0-3
    template(kube_client, namespace, "two-cores", "neuroncore.aws.com", count=2, same_chip=True)
    run(kube_client, namespace, "pair", node, "two-cores", wait)
    pair = allocated(kube_client, namespace, "pair")
    assert len(pair) == 2 and all(d.startswith("neuron-device-9-core-") for d in pair) and first not in pair, pair
    nodes, env = edits(node, namespace, "pair")
    assert nodes == {"/dev/neuron9"}
    assert set(env) == {"NEURON_RT_VISIBLE_CORES"} and core_set(env["NEURON_RT_VISIBLE_CORES"]) == local_cores(pair)

    # a device-plugin pod spec: aws.amazon.com/neuroncore: 2 wants 2 cores, but one is left: it waits for them
    create_pod(kube_client, namespace, "dp-spec", node.name, limits={"aws.amazon.com/neuroncore": "2"})
    stays_pending(kube_client, namespace, "dp-spec", wait)
    delete(kube_client, namespace, "pair", wait)
    wait(lambda: pod_phase(kube_client, namespace, "dp-spec") == "Running", "dp-spec Running", timeout=120)
    dp = allocated(kube_client, namespace, "dp-spec")
    assert len(dp) == 2 and all(d.startswith("neuron-device-9-core-") for d in dp) and first not in dp, dp
    nodes, env = edits(node, namespace, "dp-spec")
    assert nodes == {"/dev/neuron9"}
    assert set(env) == {"NEURON_RT_VISIBLE_CORES"} and core_set(env["NEURON_RT_VISIBLE_CORES"]) == local_cores(dp)
    status = json.loads(json.dumps(kube_client.get(Pod, "dp-spec", namespace=namespace).to_dict()["status"]))
    assert status["extendedResourceClaimStatus"]["requestMappings"][0]["resourceName"] == "aws.amazon.com/neuroncore"


def test_a_node_pool_opts_in_by_its_node_label(kubelet_node: MakeNode, daemon: StartDaemon, kube_client: Client,
                                               classes: None, namespace: str, wait: Wait) -> None:
    """``CORE_DEVICES=node-label`` (chart ``coreDevices.labelledNodesOnly``): the cores come and go with the Node's
    ``neuron.aws.com/core-devices=true`` label; a core pod waits for them."""
    node = kubelet_node("trn2.48xlarge")
    driver = daemon("neuron-dra-driver", "serve", "--metrics-port", "0", "--healthcheck-port", "-1",
                    "--rescan-interval", "1", env=node.env(POD_UID="label-pod", CORE_DEVICES="node-label"))

    wait(lambda: len(published(kube_client, node.name)) == CHIPS, "the chips alone on an unlabelled node", timeout=60)
    wait(lambda: "kubelet registered the DRA plugin" in driver.tail(200), "the kubelet's registration", timeout=30)
    template(kube_client, namespace, "a-core", "neuroncore.aws.com")
    create_pod(kube_client, namespace, "core", node.name, claims=[("neurons", "a-core")])
    stays_pending(kube_client, namespace, "core", wait, seconds=3)

    def label(value: str | None) -> None:
        kube_client.patch(Node, node.name, {"metadata": {"labels": {"neuron.aws.com/core-devices": value}}})

    label("true")
    wait(lambda: len(published(kube_client, node.name)) == CHIPS + CORES,
         "the cores published once the Node is labelled", timeout=30)
    wait(lambda: pod_phase(kube_client, namespace, "core") == "Running", "core Running", timeout=120)
    [core] = allocated(kube_client, namespace, "core")
    nodes, env = edits(node, namespace, "core")
    chip = int(core.split("-")[2])
    assert nodes == {f"/dev/neuron{chip}"} and env == {"NEURON_RT_VISIBLE_CORES": core.rsplit("-", 1)[1]}
    label(None)
    wait(lambda: len(published(kube_client, node.name)) == CHIPS, "the cores withdrawn once the label is gone",
         timeout=30)


def test_ultraserver_node_device_and_cores_exclude_each_other(control_plane: ControlPlane, kube_client: Client,
                                                              fake_node: Callable[..., str], classes: None,
                                                              short_tmp: Path, namespace: str, wait: Wait,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """On a trn2u node of an UltraServer, ``neuron-node`` (all the node's chips) waits for every core too: the
    real scheduler refuses it while a core is allocated, and gives it once the core's pod is gone."""
    flags = ("--set", "devicePlugin.enabled=false", "--set", "draDriver.enabled=true", "--set", "npd.enabled=false",
             "--set", "draDriver.coreDevices.enabled=true")
    with chart_objects(control_plane, kube_client, REPO_ROOT / "charts/neuron-helm-chart", flags):
        node = fake_node(labels={"node.kubernetes.io/instance-type": "trn2u.48xlarge"})
        build_host(short_tmp / "us" / "host", "trn2u.48xlarge", ultraserver_id="us-c", ultraserver_node=1)
        monkeypatch.setenv("CORE_DEVICES", "on")
        driver = DriverProcess(NEURON, short_tmp / "us", node,
                               pod_bound_kubeconfig(control_plane, kube_client, NEURON, node, wait))
        driver.start()
        try:
            supported_wait_published(kube_client, driver, CHIPS + CORES + 1, wait)
            template(kube_client, namespace, "a-core", "neuroncore.aws.com")
            kube_client.create(codecs.from_dict({
                "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
                "metadata": {"name": "the-node", "namespace": namespace},
                "spec": {"spec": {"devices": {"requests": [{"name": "neurons", "exactly": {
                    "deviceClassName": "neuron.aws.com", "selectors": [{"cel": {
                        "expression": f"device.attributes['{DRIVER}'].resourceType == 'neuron_node'"}}]}}]}}}}))
            create_pod(kube_client, namespace, "core", node, claims=[("neurons", "a-core")])
            wait(lambda: kube_client.get(Pod, "core", namespace=namespace).spec.nodeName == node,  # type: ignore[union-attr]
                 "the core pod bound")
            [core] = allocated(kube_client, namespace, "core")
            assert "-core-" in core, core
            create_pod(kube_client, namespace, "whole-node", node, claims=[("neurons", "the-node")])
            stays_pending(kube_client, namespace, "whole-node", wait)
            delete(kube_client, namespace, "core", wait)
            wait(lambda: kube_client.get(Pod, "whole-node", namespace=namespace).spec.nodeName == node,  # type: ignore[union-attr]
                 "neuron-node given once the core is free", timeout=120)
            assert allocated(kube_client, namespace, "whole-node") == ["neuron-node"]
        finally:
            driver.stop()
            with contextlib.suppress(ApiError):
                kube_client.delete(Pod, f"neuron-driver-{node}"[:63], namespace=NEURON.namespace, grace_period=0)


def test_device_plugin_core_pods_and_core_devices_hand_over_one_node(kubelet_node: MakeNode, daemon: StartDaemon,
                                                                     kube_client: Client, classes: None,
                                                                     namespace: str, wait: Wait) -> None:
    """Coexistence with core devices on (a node moving from the device plugin to DRA): a device-plugin pod holding
    ``aws.amazon.com/neuroncore: 2`` keeps running; the DRA driver leaves out exactly the chip of those cores and the
    two cores as devices (the chip's other cores stay free), the device plugin stands down, an unchanged
    ``neuroncore: 2`` pod spec lands through DRA on other cores, and the held ones come back once their pod ends.
    Facts: at LNC 2 a Trainium2 chip has 4 logical cores, and ``aws.amazon.com/neuroncore`` ID ``g`` is core
    ``g % 4`` of chip ``g // 4`` (neuron.md)."""
    node = kubelet_node("trn2.48xlarge")
    daemon("neuron-device-plugin", "serve", "--metrics-port", "0", env=node.env())
    both = lambda: (allocatable(kube_client, node.name, NEURON_RESOURCE),  # noqa: E731
                    allocatable(kube_client, node.name, NEURONCORE_RESOURCE))
    wait(lambda: both() == (CHIPS, CORES), "the device plugin serving 16 / 64", timeout=60)
    create_pod(kube_client, namespace, "dp", node.name, limits={NEURONCORE_RESOURCE: "2"})
    wait(lambda: pod_phase(kube_client, namespace, "dp") == "Running", "dp Running", timeout=90)
    held = [int(i) for i in pod_devices(node, "dp", NEURONCORE_RESOURCE)]
    assert len(held) == 2, held
    held_names = {f"neuron-device-{g // 4}-core-{g % 4}" for g in held} | {f"neuron-device-{g // 4}" for g in held}

    driver = daemon("neuron-dra-driver", "serve", "--metrics-port", "0", "--healthcheck-port", "-1",
                    "--rescan-interval", "1", env=node.env(POD_UID="handover-pod", CORE_DEVICES="on"))
    every = {f"neuron-device-{c}" for c in range(CHIPS)} | {
        f"neuron-device-{c}-core-{k}" for c in range(CHIPS) for k in range(CORES // CHIPS)}

    wait(lambda: published(kube_client, node.name) == every - held_names and both() == (0, 0),
         "DRA serving without dp's chip and cores; the device plugin stood down", timeout=90)
    assert pod_phase(kube_client, namespace, "dp") == "Running"
    wait(lambda: "kubelet registered the DRA plugin" in driver.tail(200), "the kubelet's registration", timeout=30)

    create_pod(kube_client, namespace, "dra", node.name, limits={NEURONCORE_RESOURCE: "2"})
    wait(lambda: pod_phase(kube_client, namespace, "dra") == "Running", "the unchanged pod spec Running through DRA",
         timeout=120)
    got = allocated(kube_client, namespace, "dra")
    assert len(got) == 2 and all("-core-" in d for d in got) and not set(got) & held_names, (got, held_names)
    assert set(pod_devices(node, "dra", None)) == set(got), "the kubelet's PodResources: the claim's devices"

    delete(kube_client, namespace, "dp", wait)
    wait(lambda: published(kube_client, node.name) == every, "dp's chip and cores published again", timeout=20)


def pod_devices(node: RealNode, pod: str, resource: str | None) -> list[str]:
    """What the kubelet's PodResources says ``pod`` holds: the device plugin's IDs of ``resource``, or (None) its DRA
    claims' device names."""
    client = PodResourcesClient(node.kubelet.layout.kubelet_root / "pod-resources" / "kubelet.sock")
    try:
        response = client.list()
    finally:
        client.close()
    [entry] = [p for p in response.pod_resources if p.name == pod]
    if resource is None:
        return [r.device_name for c in entry.containers for dyn in c.dynamic_resources for r in dyn.claim_resources]
    return [i for c in entry.containers for d in c.devices if d.resource_name == resource for i in d.device_ids]
