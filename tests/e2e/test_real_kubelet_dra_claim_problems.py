"""Claim problems where users look (issue 31 item 7), with the REAL kubelet, kube-scheduler and API server, both DRA
drivers running with the charts' ClusterRoles and a pod-bound token (as the DaemonSet's pod has):

- a claim whose opaque config the driver refuses gets ``Ready=False`` with the reason in its
  ``status.devices[].conditions`` and ONE Warning Event on its pod, however often the kubelet retries the prepare
  (the kubelet's own ``FailedPrepareDynamicResources`` Event counts its retries);
- a prepared device that turns unhealthy on the fake host shows ``Ready=False`` (``DeviceUnhealthy``), then ``True``
  again once healthy, and the prepare's ``data`` stays.

Facts the assertions use (not our code): NeuronConfig's ``logicalNeuronCore`` is 1 or 2 (neuron.md); EfaConfig has
no settings; the Neuron health rule (a /dev node gone) and the EFA one (port not ACTIVE); the kubelet's event
reason for a failed prepare is ``FailedPrepareDynamicResources`` (k8s.io/kubernetes pkg/kubelet/events).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from accel_rig.controlplane import ControlPlane
from conftest import Daemon, RealNode
from dra_support import EFA as SUPPORT_EFA
from dra_support import NEURON as SUPPORT_NEURON
from dra_support import pod_bound_kubeconfig, pod_claim_name
from kube_helpers import create_pod
from lightkube import ApiError, AsyncClient, Client, KubeConfig
from lightkube.resources.core_v1 import Event as CoreEvent
from lightkube.resources.core_v1 import Pod
from lightkube.resources.events_v1 import Event
from lightkube.resources.resource_v1 import ResourceClaim
from test_real_kubelet_dra137 import (  # the module's fixtures and helpers (classes, chart_rbac: both charts' RBAC)
    EFA,
    NEURON,
    Kind,
    chart_rbac,
    classes,
    container_nodes,
    create_in,
    published,
    running,
)

from accel_core.dra.claimreport import ClaimProblem, PodRef
from accel_core.dra.reporter import ClaimReporter

__all__ = ["chart_rbac", "classes"]  # fixtures used by name

Wait = Callable[..., Any]
MakeNode = Callable[..., RealNode]
StartDaemon = Callable[..., Daemon]
BAD_CONFIG = {NEURON: {"apiVersion": "neuron.aws.com/v1", "kind": "NeuronConfig", "logicalNeuronCore": 3},
              EFA: {"apiVersion": "efa.aws.com/v1", "kind": "EfaConfig", "mtu": 9001}}
BAD_FIELD = {NEURON: "logicalNeuronCore", EFA: "mtu"}


@contextlib.contextmanager
def rbac_driver(control_plane: ControlPlane, kubelet_node: MakeNode, daemon: StartDaemon, client: Client,
                kind: Kind, wait: Wait) -> Iterator[tuple[RealNode, Daemon]]:
    """A node and its driver, talking to the API server as the chart's ServiceAccount with a pod-bound token."""
    node = kubelet_node(kind.instance_type)
    support = SUPPORT_NEURON if kind is NEURON else SUPPORT_EFA
    kubeconfig = pod_bound_kubeconfig(control_plane, client, support, node.name, wait)
    try:
        driver = daemon(kind.console, "serve", "--metrics-port", "0", "--healthcheck-port", "-1",
                        "--rescan-interval", "1", env=node.env(POD_UID=f"{kind.console}-pod",
                                                               KUBECONFIG=str(kubeconfig)))
        wait(lambda: published(client, node.name, kind) == kind.devices, "devices published", timeout=60)
        wait(lambda: "kubelet registered the DRA plugin" in driver.tail(200), "the kubelet's registration",
             timeout=30)
        yield node, driver
    finally:
        with contextlib.suppress(ApiError):
            client.delete(Pod, f"{support.driver.split('.')[0]}-driver-{node.name}"[:63],
                          namespace=support.namespace, grace_period=0)


def template(name: str, kind: Kind, count: int, params: dict[str, Any] | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {"requests": [{"name": "r", "exactly": {"deviceClassName": kind.device_class,
                                                                    "count": count}}]}
    if params is not None:
        spec["config"] = [{"opaque": {"driver": kind.driver, "parameters": params}}]
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate", "metadata": {"name": name},
            "spec": {"spec": {"devices": spec}}}


def claim_of(client: Client, namespace: str, pod: str) -> dict[str, Any] | None:
    name = pod_claim_name(client, namespace, pod)
    return None if name is None else client.get(ResourceClaim, name, namespace=namespace).to_dict()


def ready(client: Client, namespace: str, pod: str, kind: Kind) -> dict[str, dict[str, Any]]:
    """Device -> its entry in the claim's status.devices, for this driver's entries."""
    claim = claim_of(client, namespace, pod) or {}
    return {e["device"]: e for e in claim.get("status", {}).get("devices") or [] if e["driver"] == kind.driver}


def kubelet_retries(client: Client, namespace: str, pod: str) -> int:
    """How often the kubelet reported the failed prepare (its Event's count)."""
    return sum(e.count or 1 for e in client.list(CoreEvent, namespace=namespace,
                                                 fields={"involvedObject.name": pod})
               if e.reason == "FailedPrepareDynamicResources")


@pytest.mark.parametrize("kind", [NEURON, EFA], ids=["neuron", "efa"])
def test_a_bad_config_shows_on_the_claim_and_once_on_the_pod(control_plane: ControlPlane, kubelet_node: MakeNode,
                                                             daemon: StartDaemon, kube_client: Client,
                                                             chart_rbac: None, namespace: str, wait: Wait,
                                                             kind: Kind) -> None:
    with rbac_driver(control_plane, kubelet_node, daemon, kube_client, kind, wait) as (node, driver):
        create_in(kube_client, namespace, template("bad", kind, 2, BAD_CONFIG[kind]))
        create_pod(kube_client, namespace, "user", node.name, claims=[("dev", "bad")])

        def refused() -> dict[str, dict[str, Any]] | None:
            entries = ready(kube_client, namespace, "user", kind)
            return entries if len(entries) == 2 else None

        entries = wait(refused, "Ready=False on the claim's devices", timeout=90)
        claim = claim_of(kube_client, namespace, "user") or {}
        allocated = {r["device"] for r in claim["status"]["allocation"]["devices"]["results"]}
        assert set(entries) == allocated
        for device, entry in entries.items():
            (cond,) = entry["conditions"]
            assert (cond["type"], cond["status"], cond["reason"]) == ("Ready", "False", "InvalidConfig"), cond
            assert claim["metadata"]["name"] in cond["message"] and device in cond["message"]
            assert BAD_FIELD[kind] in cond["message"], cond
        start = time.monotonic()
        retries = wait(lambda: (n := kubelet_retries(kube_client, namespace, "user")) >= 3 and n,
                       "the kubelet retrying the prepare", timeout=120)
        pod_uid = kube_client.get(Pod, "user", namespace=namespace).metadata.uid  # type: ignore[union-attr]
        # read through core/v1 (the kubelet's own Events have no eventTime, which events.k8s.io/v1 decoding needs):
        # what kubectl describe pod lists, an events.k8s.io/v1 Event's fields under their core names
        events = kube_client.list(CoreEvent, namespace=namespace, fields={"involvedObject.uid": str(pod_uid)})
        ours = [e for e in events if e.reportingComponent == kind.driver]
        assert len(ours) == 1, f"{len(ours)} Events for {retries} kubelet retries in {time.monotonic() - start:.0f} s"
        (event,) = ours
        assert (event.type, event.reason, event.action) == ("Warning", "InvalidConfig", "PrepareResourceClaim")
        assert event.reportingInstance == node.name and event.series is None
        assert (event.involvedObject.kind, event.involvedObject.name) == ("Pod", "user")
        assert event.related is not None
        assert (event.related.kind, event.related.name) == ("ResourceClaim", claim["metadata"]["name"])
        assert event.message is not None and BAD_FIELD[kind] in event.message
        v1 = kube_client.get(Event, str(event.metadata.name), namespace=namespace)  # type: ignore[union-attr]
        assert v1.reportingController == kind.driver and v1.regarding is not None and v1.regarding.uid == pod_uid
        assert kube_client.get(Pod, "user", namespace=namespace).status.phase == "Pending"  # type: ignore[union-attr]
        assert "could not" not in driver.tail(400), driver.tail(400)


@pytest.mark.parametrize("kind", [NEURON, EFA], ids=["neuron", "efa"])
def test_a_prepared_device_that_turns_unhealthy_shows_it_on_the_claim(control_plane: ControlPlane,
                                                                      kubelet_node: MakeNode, daemon: StartDaemon,
                                                                      kube_client: Client, chart_rbac: None,
                                                                      namespace: str, wait: Wait, kind: Kind) -> None:
    with rbac_driver(control_plane, kubelet_node, daemon, kube_client, kind, wait) as (node, driver):
        create_in(kube_client, namespace, template("one", kind, 1))
        create_pod(kube_client, namespace, "user", node.name, claims=[("dev", "one")])
        running(kube_client, namespace, "user", wait)
        (victim,) = container_nodes(node, "user", namespace, kind)

        def condition(status: str) -> Callable[[], dict[str, Any] | None]:
            def check() -> dict[str, Any] | None:
                entries = list(ready(kube_client, namespace, "user", kind).values())
                if len(entries) == 1 and entries[0]["conditions"][0]["status"] == status:
                    return dict(entries[0])
                return None
            return check

        before = wait(condition("True"), "Ready=True after the prepare", timeout=60)
        ibdev = ""
        if kind is NEURON:
            node.host.remove_dev_node(victim)
        else:
            uverbs = victim.removeprefix("/dev/infiniband/")
            ibdev = (node.host.root / "sys/class/infiniband_verbs" / uverbs / "ibdev").read_text().strip()
            node.host.set_port_state(ibdev, "DOWN")
        sick = wait(condition("False"), "Ready=False once the device is unhealthy", timeout=60)
        (cond,) = sick["conditions"]
        assert cond["reason"] == "DeviceUnhealthy" and sick["device"] in cond["message"], cond
        assert sick["data"] == before["data"], "the prepare's data stays"
        if kind is NEURON:
            node.host.restore_dev_node(victim)
        else:
            node.host.set_port_state(ibdev, "ACTIVE")
        well = wait(condition("True"), "Ready=True once healthy again", timeout=60)
        assert well["conditions"][0]["reason"] == "Prepared" and well["data"] == before["data"]
        assert "could not" not in driver.tail(400), driver.tail(400)


def test_repeats_update_the_series_of_one_event_with_the_charts_rbac(control_plane: ControlPlane,
                                                                      kube_client: Client, chart_rbac: None,
                                                                      namespace: str, wait: Wait) -> None:
    """The series update (a second server-side apply of the same Event, eventTime unchanged) passes the API
    server's Event validation and the chart's RBAC; the kubelet path above sees it only after a minute."""
    kubeconfig = pod_bound_kubeconfig(control_plane, kube_client, SUPPORT_EFA, "series-node", wait)
    create_pod(kube_client, namespace, "user", "series-node")
    pod_uid = str(kube_client.get(Pod, "user", namespace=namespace).metadata.uid)  # type: ignore[union-attr]
    problem = ClaimProblem(namespace, "c", "uid-c", (("series-node", "d0", None),), (PodRef("user", pod_uid),),
                           "InvalidConfig", "efa.aws.com/v1 EfaConfig: unknown field mtu")

    async def report() -> ClaimReporter:
        client = AsyncClient(KubeConfig.from_file(kubeconfig))
        reporter = ClaimReporter(client, EFA.driver, "series-node", prepared=lambda uid: None,
                                 health=lambda device: None, write_status=False, series_seconds=0.0)
        stop = asyncio.Event()
        task = asyncio.create_task(reporter.run(stop))
        await asyncio.sleep(0)
        for _ in range(3):
            reporter.submit([problem])
            await asyncio.sleep(0.5)
        stop.set()
        await task
        await client.close()
        return reporter

    try:
        reporter = asyncio.run(report())
        assert (reporter.events_created, reporter.events_updated, reporter.failed) == (1, 2, 0)
        (event,) = [e for e in kube_client.list(Event, namespace=namespace) if e.reportingController == EFA.driver]
        assert event.series is not None and event.series.count == 3, event.series
        assert event.regarding is not None and event.regarding.uid == pod_uid
    finally:
        with contextlib.suppress(ApiError):
            kube_client.delete(Pod, "efa-driver-series-node", namespace=SUPPORT_EFA.namespace, grace_period=0)
