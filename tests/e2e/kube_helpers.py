"""Small helpers for e2e tests against the real API server and real kubelet nodes (no test logic here)."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from lightkube import ApiError, Client
from lightkube.resources.core_v1 import Event, Node, Pod

EFA = "vpc.amazonaws.com/efa"
NEURON = "aws.amazon.com/neuron"
NEURONCORE = "aws.amazon.com/neuroncore"


def allocatable(client: Client, node: str, resource: str) -> int | None:
    """The Node's allocatable count of ``resource`` (None while it is not listed)."""
    status = client.get(Node, node).status
    value = (status.allocatable or {}).get(resource) if status is not None else None
    return None if value is None else int(value)


def capacity(client: Client, node: str, resource: str) -> int | None:
    status = client.get(Node, node).status
    value = (status.capacity or {}).get(resource) if status is not None else None
    return None if value is None else int(value)


def create_pod(client: Client, namespace: str, name: str, node: str, *, limits: Mapping[str, str] | None = None,
               claims: Sequence[tuple[str, str]] = (), containers: int = 1) -> None:
    """A Pod pinned to ``node`` by its hostname label (the scheduler still decides, and still checks resources).
    ``claims`` are (claim name, ResourceClaimTemplate) pairs, all used by every container."""
    spec: dict[str, Any] = {
        "nodeSelector": {"kubernetes.io/hostname": node},
        "terminationGracePeriodSeconds": 1,
        "containers": [
            {"name": f"c{i}", "image": "public.ecr.aws/docker/library/busybox:latest",
             "resources": {**({"limits": dict(limits)} if limits else {}),
                           **({"claims": [{"name": c} for c, _ in claims]} if claims else {})}}
            for i in range(containers)
        ],
    }
    if claims:
        spec["resourceClaims"] = [{"name": c, "resourceClaimTemplateName": tmpl} for c, tmpl in claims]
    client.create(Pod.from_dict({"metadata": {"name": name, "namespace": namespace}, "spec": spec}))  # type: ignore[call-overload]


def pod_phase(client: Client, namespace: str, name: str) -> str | None:
    try:
        status = client.get(Pod, name, namespace=namespace).status
    except ApiError:
        return None
    return status.phase if status is not None else None


def pod_gone(client: Client, namespace: str, name: str) -> bool:
    try:
        client.get(Pod, name, namespace=namespace)
    except ApiError as e:
        return e.status.code == 404
    return False


def pod_events(client: Client, namespace: str, name: str) -> list[tuple[str, str]]:
    """(reason, message) of the Events about a Pod."""
    return [(e.reason or "", e.message or "") for e in client.list(Event, namespace=namespace)
            if e.involvedObject.kind == "Pod" and e.involvedObject.name == name]


def pcie_root_of_uverbs(host_root: Path, uverbs: str) -> str:
    """The PCIe root (``pci0000:XX``) of a uverbs device, by the usual definition: the first component of the resolved
    sysfs path of its PCI device (``/sys/class/infiniband_verbs/<uverbs>/device``)."""
    link = host_root / "sys" / "class" / "infiniband_verbs" / uverbs / "device"
    resolved = Path(os.path.realpath(link)).relative_to(host_root)
    parts = resolved.parts  # ('sys', 'devices', 'pci0000:XX', ...)
    assert parts[:2] == ("sys", "devices") and parts[2].startswith("pci"), resolved
    return parts[2]


def cdi_edits(cdi_root: Path, names: tuple[str, ...]) -> tuple[set[str], dict[str, str]]:
    """(device node paths, env) the runtime would apply for these CDI device names, read from the spec files;
    fails when a name is in no spec."""
    specs = [json.loads(p.read_text()) for p in cdi_root.glob("*.json")]
    nodes: set[str] = set()
    env: dict[str, str] = {}
    for qualified in names:
        kind, _, dev = qualified.partition("=")
        matches = [d for s in specs if s["kind"] == kind for d in s["devices"] if d["name"] == dev]
        assert len(matches) == 1, f"CDI device {qualified} is in {len(matches)} specs under {cdi_root}"
        edits = matches[0].get("containerEdits", {})
        nodes |= {n["path"] for n in edits.get("deviceNodes", [])}
        env.update(e.split("=", 1) for e in edits.get("env", []))
    return nodes, env
