"""Helpers of the containerd tests: helm as the seeds run it, DaemonSet status as ``kubectl get ds`` prints it, and
workload pods whose own containers print what they see (read back from the node's ``/var/log/pods``)."""

from __future__ import annotations

import contextlib
import copy
import os
import re
import shlex
import socket
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from accel_rig.controlplane import ControlPlane
from accel_rig.kubeletnode import KubeletNode
from chart_render import NEURON_CHART, NEURON_OCI
from lightkube import ApiError, Client, KubeConfig, codecs
from lightkube.resources.apps_v1 import DaemonSet
from lightkube.resources.core_v1 import Event, Node, Pod
from lightkube.resources.resource_v1 import ResourceSlice

REPO = Path(__file__).resolve().parents[1]
BUSYBOX = "example.local/busybox:1.35"
#: What every workload container prints: its device nodes, then its environment, then it waits to be deleted.
SHOW = "ls -l /dev/infiniband /dev/neuron* 2>&1; echo ---env; env | sort; echo ---end; exec sleep 3600"
Wait = Callable[..., Any]


def chart_image() -> str:
    """The charts' default image (repository and appVersion), which ``make image`` tags."""
    values = yaml.safe_load((NEURON_CHART / "values.yaml").read_text())
    version = yaml.safe_load((NEURON_CHART / "Chart.yaml").read_text())["appVersion"]
    return f"{values['image']['repository']}:{version}"


class Helm:
    """helm against the test control plane as admin, with private helm home directories.

    ``uninstall`` runs without the charts' hooks unless ``hooks=True``: a DRA release's pre-delete hook is a Job,
    which only a containerd node can run (on kubelet-less or fakecri nodes helm would wait for it until its deadline);
    the tests of the handoff it makes (coexistence, migration) run on containerd nodes with ``hooks=True``."""

    def __init__(self, control_plane: ControlPlane, home: Path, *, hooks: bool = False) -> None:
        self.hooks = hooks
        self.binary = control_plane.helm
        self.kubeconfig = str(control_plane.admin_kubeconfig)
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("HELM_") and k != "KUBECONFIG"}
        for var in ("HELM_CACHE_HOME", "HELM_CONFIG_HOME", "HELM_DATA_HOME"):
            self.env[var] = str(home / var.lower())

    def __call__(self, *args: str) -> str:
        if args[:1] == ("uninstall",) and not self.hooks:
            args = (*args, "--no-hooks")
        proc = subprocess.run([str(self.binary), *args, "--kubeconfig", self.kubeconfig], env=self.env,
                              capture_output=True, text=True, timeout=180, check=False)
        assert proc.returncode == 0, f"helm {' '.join(args)} failed:\n{proc.stdout}\n{proc.stderr}"
        return proc.stdout

    def seed(self, command: str, chart: Path = NEURON_CHART, *extra: str) -> str:
        """A documented ``helm upgrade --install`` line (the local chart standing in for the OCI reference),
        plus ``extra`` arguments."""
        argv = shlex.split(command.replace("\\\n", " "))
        assert argv[0] == "helm" and NEURON_OCI in argv, argv
        return self(*[str(chart) if a == NEURON_OCI else a for a in argv[1:]], *extra)

    def manifest(self, release: str, namespace: str) -> list[dict[str, Any]]:
        out = self("get", "manifest", release, "--namespace", namespace)
        return [d for d in yaml.safe_load_all(out) if d]


def rig_flags(node: KubeletNode) -> list[str]:
    """What a rig node adds to the seeds' commands: the locally built image, never pulled, and fake-sysfs mode."""
    return ["--set", "image.pullPolicy=Never", "--set", f"fakeHost.path={node.layout.host_root}"]


def ds_row(client: Client, namespace: str, name: str) -> dict[str, int]:
    """The numbers of ``kubectl get ds``: DESIRED CURRENT READY UP-TO-DATE AVAILABLE."""
    status = client.get(DaemonSet, name, namespace=namespace).to_dict().get("status", {})
    return {k: int(status.get(f, 0) or 0) for k, f in (
        ("desired", "desiredNumberScheduled"), ("current", "currentNumberScheduled"), ("ready", "numberReady"),
        ("up_to_date", "updatedNumberScheduled"), ("available", "numberAvailable"))}


def ds_ready(client: Client, namespace: str, name: str, want: int = 1) -> bool:
    row = ds_row(client, namespace, name)
    return all(v == want for v in row.values())


def pods_of(client: Client, namespace: str, labels: dict[str, str]) -> list[dict[str, Any]]:
    return [p.to_dict() for p in client.list(Pod, namespace=namespace, labels=labels)]


def running_1_of_1(pod: dict[str, Any]) -> bool:
    """``kubectl get pods`` would print READY 1/1 and STATUS Running."""
    status = pod.get("status", {})
    statuses = status.get("containerStatuses") or []
    return (status.get("phase") == "Running" and len(statuses) == 1 and bool(statuses[0].get("ready"))
            and pod.get("metadata", {}).get("deletionTimestamp") is None)


def allocatable(client: Client, node: str, resource: str) -> int:
    value = (client.get(Node, node).to_dict().get("status", {}).get("allocatable") or {}).get(resource, "0")
    return int(value)


def workload_docs(path: Path, name_suffix: str) -> list[dict[str, Any]]:
    """An example manifest with each Pod's image swapped for the local busybox and its command for SHOW (the
    examples name a public busybox and `sleep infinity`); names get ``name_suffix`` so tests do not collide."""
    out = []
    for doc in yaml.safe_load_all(path.read_text()):
        if not doc:
            continue
        doc = copy.deepcopy(doc)
        doc["metadata"]["name"] += name_suffix
        if doc["kind"] == "Pod":
            spec = doc["spec"]
            spec["terminationGracePeriodSeconds"] = 1
            for c in spec["containers"]:
                c["image"], c["imagePullPolicy"], c["command"] = BUSYBOX, "Never", ["sh", "-c", SHOW]
            for rc in spec.get("resourceClaims", []):
                if "resourceClaimTemplateName" in rc:
                    rc["resourceClaimTemplateName"] += name_suffix
        out.append(doc)
    return out


def device_plugin_pod(name: str, resource: str, count: int, node: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
            "spec": {"nodeName": node, "restartPolicy": "Never", "terminationGracePeriodSeconds": 1,
                     "tolerations": [{"operator": "Exists"}],
                     "containers": [{"name": "app", "image": BUSYBOX, "imagePullPolicy": "Never",
                                     "command": ["sh", "-c", SHOW],
                                     "resources": {"limits": {resource: str(count)}}}]}}


@contextlib.contextmanager
def applied(client: Client, namespace: str, docs: list[dict[str, Any]]) -> Iterator[list[Any]]:
    """Create ``docs`` in ``namespace``; delete them (Pods first) afterwards. Pods get a 1 s grace period, not a
    force delete: that would free their claims' devices in the API while the kubelet still holds them prepared."""
    objs = [codecs.from_dict(d) for d in docs]
    made = []
    try:
        for obj in objs:
            made.append(client.create(obj, namespace=namespace))
        yield made
    finally:
        for obj in sorted(made, key=lambda o: 0 if o.kind == "Pod" else 1):
            with contextlib.suppress(ApiError):
                client.delete(type(obj), obj.metadata.name, namespace=namespace,
                              grace_period=1 if obj.kind == "Pod" else None)


def container_view(node: KubeletNode, namespace: str, pod: str, wait: Wait, timeout: float = 120) -> ContainerView:
    """What the pod's ``app`` container printed about itself (waits for the whole SHOW output)."""
    text = wait(lambda: (t := node.pod_log(namespace, pod, "app")) and "---end" in t and t,
                f"the output of {namespace}/{pod}", timeout=timeout)
    return ContainerView(text)


class ContainerView:
    """The device nodes and environment a container saw, parsed from its own ``ls -l`` and ``env``."""

    LS_DEVICE = re.compile(r"^c\S+\s+\d+\s+\S+\s+\S+\s+(\d+),\s*(\d+)\s+.*?(\S+)$")

    def __init__(self, text: str) -> None:
        self.text = text
        head, _, rest = text.partition("---env\n")
        env_text = rest.partition("---end")[0]
        self.env = dict(line.split("=", 1) for line in env_text.splitlines() if "=" in line)
        self.devices: dict[str, tuple[int, int]] = {}
        for line in head.splitlines():
            m = self.LS_DEVICE.match(line.strip())
            if m:
                self.devices[m.group(3).rsplit("/", 1)[-1]] = (int(m.group(1)), int(m.group(2)))

    def names(self, prefix: str) -> list[str]:
        return sorted((n for n in self.devices if n.startswith(prefix)), key=lambda n: int(re.sub(r"\D", "", n) or 0))


# -- both sides of one node (coexistence and migration tests) ---------------------------------------------------
def slice_devices(client: Client, node: str, driver: str) -> int:
    return sum(len(s.spec.devices or []) for s in client.list(ResourceSlice)
               if s.spec.nodeName == node and s.spec.driver == driver)


@dataclass
class Sides:
    """Samples both sides of one node every 0.25 s in a thread of its own (its own API client)."""

    kubeconfig: str
    node: str
    resource: str
    driver: str
    samples: list[tuple[float, int, int]] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)

    def __post_init__(self) -> None:
        self._client = Client(KubeConfig.from_file(self.kubeconfig))
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(0.25):
            with contextlib.suppress(ApiError, OSError):
                self.samples.append((time.monotonic(), allocatable(self._client, self.node, self.resource),
                                     slice_devices(self._client, self.node, self.driver)))

    def both(self) -> list[tuple[float, int, int]]:
        return [s for s in self.samples if s[1] > 0 and s[2] > 0]

    def plugin_max_since(self, since: float) -> int:
        return max((s[1] for s in self.samples if s[0] >= since), default=0)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)
        assert self.both() == [], f"both sides served {self.node} at once: {self.both()[:5]}"


@contextlib.contextmanager
def sampled(control_plane: ControlPlane, node: str, resource: str, driver: str) -> Iterator[Sides]:
    sides = Sides(str(control_plane.admin_kubeconfig), node, resource, driver)
    try:
        yield sides
    finally:
        sides.stop()


def ds_pod(client: Client, namespace: str, ds: str) -> Pod | None:
    selector = client.get(DaemonSet, ds, namespace=namespace).spec.selector.matchLabels
    pods = [p for p in client.list(Pod, namespace=namespace, labels=selector)
            if p.metadata.deletionTimestamp is None]
    return pods[0] if pods else None


def pod_ready(pod: Pod | None) -> bool:
    statuses = (pod.status.containerStatuses or []) if pod is not None and pod.status is not None else []
    return bool(statuses) and all(s.ready for s in statuses)


def node_events(client: Client, node: str, reason: str) -> list[Event]:
    return [e for e in client.list(Event, namespace="default")
            if e.involvedObject.kind == "Node" and e.involvedObject.name == node and e.reason == reason]


def delete_pod(client: Client, pod: Pod) -> None:
    assert pod.metadata is not None
    client.delete(Pod, pod.metadata.name, namespace=pod.metadata.namespace)


@contextlib.contextmanager
def port_forward(kubectl: Callable[..., subprocess.Popen[str]], namespace: str, target: str,
                 port: int) -> Iterator[int]:
    """``kubectl port-forward -n NAMESPACE TARGET LOCAL:PORT`` on a free local port (``kubectl`` starts kubectl with
    these arguments, its output piped as text); yields the local port once kubectl says it forwards."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        local = int(s.getsockname()[1])
    proc = kubectl("port-forward", "-n", namespace, target, f"{local}:{port}", "--address", "127.0.0.1")
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert "Forwarding from 127.0.0.1" in line, line + (proc.stdout.read() if proc.poll() is not None else "")
        yield local
    finally:
        proc.kill()
        proc.wait(timeout=10)
