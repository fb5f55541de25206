"""The made-up third accelerator (tests/sample_accelerator, registered only by its entry point) through both adapters
with the REAL kubelet, on a fake ``sacc.8xlarge`` its own fake-host part writes from its own catalog section.

Facts the assertions use, from the sample's declaration and catalog file (not from its daemons): sacc.8xlarge has
4 devices ``/dev/sacc0..3``; the device plugin serves ``example.com/sacc``, the DRA driver ``sacc.example.com``;
a device whose ``health`` file says ``fault`` must not be handed out; a CDI device name is
``<kind>=<device name>``."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from conftest import Daemon, RealNode
from kube_helpers import allocatable, capacity, cdi_edits, create_pod, pod_gone, pod_phase
from lightkube import ApiError, Client
from lightkube.resources.core_v1 import Pod
from lightkube.resources.resource_v1 import DeviceClass, ResourceClaimTemplate, ResourceSlice

Wait = Callable[..., Any]
RESOURCE, DRIVER, TYPE = "example.com/sacc", "sacc.example.com", "sacc.8xlarge"


def indices(paths: Any) -> list[int]:
    out = []
    for p in paths:
        m = re.fullmatch(r"/dev/sacc(\d)", p)
        assert m, f"{p} is not a sacc device node"
        out.append(int(m.group(1)))
    return sorted(out)


def test_the_sample_device_plugin_through_the_real_kubelet(kubelet_node: Callable[..., RealNode],
                                                           daemon: Callable[..., Daemon], kube_client: Client,
                                                           namespace: str, wait: Wait) -> None:
    node = kubelet_node(TYPE)
    daemon("sample-device-plugin", "serve", "--metrics-port", "0", env=node.env())
    wait(lambda: allocatable(kube_client, node.name, RESOURCE) == 4, f"{RESOURCE}: 4 on the Node", timeout=60)
    create_pod(kube_client, namespace, "two", node.name, limits={RESOURCE: "2"})
    wait(lambda: pod_phase(kube_client, namespace, "two") == "Running", "the sacc: 2 pod Running", timeout=90)
    (ctr,) = node.kubelet.containers("two", namespace)
    held = indices(ctr.device_paths)
    assert len(held) == 2 and ctr.envs["SACC_VISIBLE_DEVICES"] == ",".join(map(str, held))

    free = next(i for i in range(4) if i not in held)
    node.host.set_sacc_health(free, "fault")
    wait(lambda: allocatable(kube_client, node.name, RESOURCE) == 3, "allocatable 3 after a fault", timeout=30)
    assert capacity(kube_client, node.name, RESOURCE) == 4
    node.host.set_sacc_health(free, "ok")
    wait(lambda: allocatable(kube_client, node.name, RESOURCE) == 4, "allocatable back to 4", timeout=30)


def _slices(client: Client, node: str) -> list[ResourceSlice]:
    return list(client.list(ResourceSlice, fields={"spec.nodeName": node, "spec.driver": DRIVER}))


def _taints(client: Client, node: str) -> dict[str, list[str]]:
    return {d.name: [t.key for t in (d.taints or [])] for s in _slices(client, node) for d in s.spec.devices or []}


def test_the_sample_dra_driver_through_the_real_kubelet(kubelet_node: Callable[..., RealNode],
                                                        daemon: Callable[..., Daemon], kube_client: Client,
                                                        namespace: str, wait: Wait) -> None:
    try:
        kube_client.create(DeviceClass.from_dict({  # type: ignore[call-overload]
            "metadata": {"name": DRIVER},
            "spec": {"selectors": [{"cel": {"expression": f"device.driver == '{DRIVER}'"}}]}}))
    except ApiError as exc:
        if exc.status.code != 409:
            raise
    node = kubelet_node(TYPE)
    driver = daemon("sample-dra-driver", "serve", "--metrics-port", "0", "--healthcheck-port", "-1",
                    "--rescan-interval", "1", env=node.env(POD_UID="sacc-pod-1"))
    wait(lambda: len(_taints(kube_client, node.name)) == 4, "4 sacc devices published", timeout=60)
    wait(lambda: "kubelet registered the DRA plugin" in driver.tail(200), "the kubelet's registration", timeout=30)

    kube_client.create(ResourceClaimTemplate.from_dict({  # type: ignore[call-overload]
        "metadata": {"name": "two-sacc", "namespace": namespace},
        "spec": {"spec": {"devices": {"requests": [
            {"name": "sacc", "exactly": {"deviceClassName": DRIVER, "count": 2}}]}}}}))
    create_pod(kube_client, namespace, "claimed", node.name, claims=[("sacc", "two-sacc")])
    wait(lambda: pod_phase(kube_client, namespace, "claimed") == "Running", "the claim's pod Running", timeout=120)
    (ctr,) = node.kubelet.containers("claimed", namespace)
    assert ctr.cdi_devices and not ctr.devices, "DRA devices reach the runtime as CDI names only"
    cdi = node.kubelet.layout.cdi_root
    nodes, env = cdi_edits(cdi, ctr.cdi_devices)
    held = indices(nodes)
    assert len(held) == 2 and env["SACC_VISIBLE_DEVICES"] == ",".join(map(str, held))
    specs = [p for p in cdi.glob("*.json") if DRIVER in p.name]
    assert len(specs) == 1, specs

    free = next(i for i in range(4) if i not in held)
    node.host.set_sacc_health(free, "fault")
    wait(lambda: _taints(kube_client, node.name).get(f"sacc{free}") == [f"{DRIVER}/unhealthy"],
         f"sacc{free} tainted unhealthy in its slice", timeout=30)
    node.host.set_sacc_health(free, "ok")
    wait(lambda: _taints(kube_client, node.name).get(f"sacc{free}") == [], f"sacc{free} untainted", timeout=30)

    kube_client.delete(Pod, "claimed", namespace=namespace, grace_period=0)
    wait(lambda: pod_gone(kube_client, namespace, "claimed"), "the pod deleted", timeout=60)
    wait(lambda: not specs[0].exists(), f"the kubelet unprepared the claim ({specs[0].name} removed)", timeout=60)
