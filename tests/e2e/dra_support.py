"""Helpers for DRA end-to-end tests on the real control plane: chart objects, pod-bound driver credentials, a
driver subprocess against a fake host, claims and the kubelet stand-in's prepare/unprepare."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from accel_rig.controlplane import ControlPlane
from accel_rig.kubelet_standin import KubeletStandIn
from lightkube import ApiError, Client, codecs
from lightkube.resources.core_v1 import Namespace, Pod
from lightkube.resources.resource_v1 import ResourceClaim, ResourceSlice

from accel_core.dra.checkpoint import CheckpointFile
from accel_core.kubeletapi.constants import DRA_V1_SERVICE

Wait = Callable[..., Any]
REPO = Path(__file__).resolve().parents[2]
CHART_KINDS = ("Namespace", "ServiceAccount", "ClusterRole", "ClusterRoleBinding", "DeviceClass",
               "ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding")


@dataclass(frozen=True)
class DriverKind:
    """One DRA driver as its chart installs it."""

    driver: str  #: ``efa.aws.com``
    module: str  #: ``efa_plugin.dra.cli``
    namespace: str  #: where the chart puts its ServiceAccount
    service_account: str

    @property
    def cdi_kind(self) -> str:
        return f"k8s.{self.driver}/claim"


EFA = DriverKind("efa.aws.com", "efa_plugin.dra.cli", "kube-system", "aws-efa-k8s-device-plugin-dra-driver")
NEURON = DriverKind("neuron.aws.com", "neuron_dra.dra.cli", "neuron-dra-driver", "neuron-dra-driver-sa")


@contextlib.contextmanager
def chart_objects(control_plane: ControlPlane, client: Client, chart: Path, flags: Sequence[str]) -> Iterator[None]:
    """Apply a chart's cluster objects for a DRA driver (not its DaemonSet: no kubelet would run it)."""
    out = subprocess.run([str(control_plane.helm), "template", "x", str(chart), *flags],
                         capture_output=True, text=True, timeout=120, check=False)
    assert out.returncode == 0, out.stderr
    docs = [d for d in yaml.safe_load_all(out.stdout) if d and d.get("kind") in CHART_KINDS]
    created = []
    for doc in docs:
        obj = codecs.from_dict(doc)
        if doc["kind"] == "Namespace":
            _wait_not_terminating(client, doc["metadata"]["name"])
        deadline = time.monotonic() + 120
        while True:
            try:
                client.create(obj)
                created.append(obj)
                break
            except ApiError as exc:
                if exc.status.code == 409:
                    break
                # another test module's teardown is still deleting the namespace: wait for it to go
                if "being terminated" not in str(exc.status.message) or time.monotonic() > deadline:
                    raise
                time.sleep(0.5)
    try:
        yield
    finally:
        for obj in reversed(created):
            meta: Any = obj.metadata
            with contextlib.suppress(ApiError):
                client.delete(type(obj), meta.name, namespace=meta.namespace)  # type: ignore[arg-type]
        for obj in created:  # leave no terminating namespace behind for the next test module
            if isinstance(obj, Namespace) and obj.metadata is not None and obj.metadata.name:
                wait_namespace_gone(client, obj.metadata.name)


def _wait_not_terminating(client: Client, name: str, timeout: float = 120) -> None:
    """Another test module's teardown may still be deleting the namespace: wait until it is gone or active."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            ns = client.get(Namespace, name)
        except ApiError as exc:
            if exc.status.code == 404:
                return
            raise
        if ns.status is None or ns.status.phase != "Terminating":
            return
        time.sleep(0.5)
    raise AssertionError(f"namespace {name} still terminating after {timeout}s")


def wait_namespace_gone(client: Client, name: str, timeout: float = 120) -> None:
    """Until namespace ``name`` is deleted (AssertionError after ``timeout`` s)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            client.get(Namespace, name)
        except ApiError as exc:
            if exc.status.code == 404:
                return
            raise
        time.sleep(0.5)
    raise AssertionError(f"namespace {name} still there after {timeout}s")


def pod_bound_kubeconfig(control_plane: ControlPlane, client: Client, kind: DriverKind, node: str,
                         wait: Wait) -> Path:
    """A kubeconfig whose token is bound to a Pod of the driver's ServiceAccount on ``node`` (as the kubelet would
    give the DaemonSet pod), so it carries the node name the chart's admission policy checks."""
    pod_name = f"{kind.driver.split('.')[0]}-driver-{node}"[:63]
    client.create(Pod.from_dict({  # type: ignore[call-overload]
        "metadata": {"name": pod_name, "namespace": kind.namespace},
        "spec": {"serviceAccountName": kind.service_account, "nodeName": node,
                 "containers": [{"name": "driver", "image": "driver:test"}]}}))
    wait(lambda: client.get(Pod, pod_name, namespace=kind.namespace), "the driver pod")
    token = control_plane.mint_token(kind.namespace, kind.service_account, bound_pod=pod_name)
    return control_plane.kubeconfig_for_token(str(token), name=pod_name)


class DriverProcess:
    """``<driver> serve`` as a subprocess against a fake host shared with the node's other drivers."""

    def __init__(self, kind: DriverKind, root: Path, node: str, kubeconfig: Path) -> None:
        self.kind = kind
        self.node = node
        self.host_root = root / "host"
        self.kubelet_root = root / "kubelet"
        self.cdi_root = root / "cdi"
        self.log = root / f"{kind.driver}.log"
        self.kubeconfig = kubeconfig
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        env = {**os.environ, "PYTHONPATH": str(REPO), "NODE_NAME": self.node, "POD_UID": "pod-uid-1"}
        env.pop("KUBECONFIG", None)
        with self.log.open("ab") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", self.kind.module, "serve", "--host-root", str(self.host_root),
                 "--kubelet-root", str(self.kubelet_root),
                 "--device-plugins-dir", str(self.kubelet_root / "device-plugins"), "--cdi-root", str(self.cdi_root),
                 "--kubeconfig", str(self.kubeconfig), "--metrics-port", "0", "--healthcheck-port", "-1",
                 "--rescan-interval", "1"],
                env=env, stdout=log, stderr=subprocess.STDOUT)

    def stop(self) -> int:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout=30)

    def kill9(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=30)

    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def tail(self) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-30:]) if self.log.exists() else ""

    def cdi_spec(self, uid: str) -> dict[str, Any] | None:
        path = self.cdi_root / f"{self.kind.cdi_kind.replace('/', '-')}_{uid}.json"
        if not path.exists():
            return None
        data: dict[str, Any] = json.loads(path.read_text())
        return data

    def checkpoint_claims(self) -> dict[str, Any]:
        """The entries a restarted driver would find (snapshot and journal, read as the driver reads them)."""
        return CheckpointFile(self.kubelet_root / "plugins" / self.kind.driver / "checkpoint.json").load().claims


def node_slices(client: Client, node: str, driver: str) -> list[dict[str, Any]]:
    return [s.to_dict() for s in client.list(ResourceSlice, fields={"spec.nodeName": node, "spec.driver": driver})]


def wait_published(client: Client, driver: DriverProcess, count: int, wait: Wait) -> list[dict[str, Any]]:
    def check() -> list[dict[str, Any]] | None:
        if driver.proc is not None and driver.proc.poll() is not None:
            raise AssertionError(f"{driver.kind.driver} exited with {driver.proc.returncode}:\n{driver.tail()}")
        found = node_slices(client, driver.node, driver.kind.driver)
        return found if sum(len(s["spec"].get("devices") or []) for s in found) == count else None

    try:
        slices: list[dict[str, Any]] = wait(check, f"{count} published devices of {driver.kind.driver}", timeout=90)
    except (AssertionError, TimeoutError) as exc:  # the driver exited, or the wait timed out
        raise AssertionError(f"{exc}\ndriver log:\n{driver.tail()}") from exc
    return slices


def make_pod(client: Client, namespace: str, name: str, *, template: str | None = None,
             claim: str | None = None, node: str | None = None) -> None:
    source = {"resourceClaimTemplateName": template} if template else {"resourceClaimName": claim}
    spec: dict[str, Any] = {"containers": [{"name": "app", "image": "busybox:test",
                                            "resources": {"claims": [{"name": "devices"}]}}],
                            "resourceClaims": [{"name": "devices", **source}]}
    if node:
        spec["nodeSelector"] = {"kubernetes.io/hostname": node}
    client.create(Pod.from_dict({"metadata": {"name": name, "namespace": namespace},  # type: ignore[call-overload]
                                 "spec": spec}))


def pod_claim_name(client: Client, namespace: str, pod: str) -> str | None:
    data = client.get(Pod, pod, namespace=namespace).to_dict()
    statuses = data.get("status", {}).get("resourceClaimStatuses") or []
    name = statuses[0].get("resourceClaimName") if statuses else None
    return str(name) if name else None


def allocated_claim(client: Client, namespace: str, wait: Wait, *, pod: str | None = None,
                    name: str | None = None) -> dict[str, Any]:
    def check() -> dict[str, Any] | None:
        claim_name = name or (pod_claim_name(client, namespace, pod) if pod else None)
        if not claim_name:
            return None
        claim: dict[str, Any] = client.get(ResourceClaim, claim_name, namespace=namespace).to_dict()
        return claim if claim.get("status", {}).get("allocation") else None

    claim: dict[str, Any] = wait(check, f"an allocated claim ({pod or name})", timeout=90)
    return claim


def pod_node(client: Client, namespace: str, pod: str) -> str | None:
    spec = client.get(Pod, pod, namespace=namespace).spec
    return spec.nodeName if spec is not None else None


def results(claim: dict[str, Any], driver: str, request: str | None = None) -> list[str]:
    """Device names the claim got from ``driver`` (for ``request``, when given)."""
    return sorted(r["device"] for r in claim["status"]["allocation"]["devices"]["results"]
                  if r["driver"] == driver and (request is None or r["request"] == request))


def ref(claim: dict[str, Any]) -> tuple[str, str, str]:
    return claim["metadata"]["namespace"], claim["metadata"]["uid"], claim["metadata"]["name"]


def call_driver(kubelet: KubeletStandIn, driver: str, *claims: dict[str, Any], unprepare: bool = False,
                refs: Sequence[tuple[str, str, str]] = ()) -> dict[str, Any]:
    """NodePrepareResources (or Unprepare) through the driver's DRA socket, as the kubelet calls it."""
    all_refs = [ref(c) for c in claims] + list(refs)

    async def call() -> dict[str, Any]:
        conn = await kubelet.register_dra(driver, timeout=30)
        try:
            assert conn.version == DRA_V1_SERVICE
            return await (conn.unprepare(*all_refs) if unprepare else conn.prepare(*all_refs))
        finally:
            await conn.close()

    return asyncio.run(call())


def spec_nodes(spec: dict[str, Any]) -> dict[str, list[str]]:
    """CDI device name -> device node paths."""
    return {d["name"]: [n["path"] for n in d["containerEdits"].get("deviceNodes", [])] for d in spec["devices"]}


def delete_and_wait(client: Client, namespace: str, pods: Sequence[str], claim: dict[str, Any],
                    wait: Wait) -> None:
    for pod in pods:
        client.delete(Pod, pod, namespace=namespace, grace_period=0)
    name = claim["metadata"]["name"]
    with contextlib.suppress(ApiError):
        if not claim["metadata"].get("ownerReferences"):
            client.delete(ResourceClaim, name, namespace=namespace)

    def gone() -> bool:
        try:
            client.get(ResourceClaim, name, namespace=namespace)
            return False
        except ApiError as exc:
            return exc.status.code == 404

    wait(gone, f"claim {namespace}/{name} deleted", timeout=90)
