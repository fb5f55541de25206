"""Reading what the scheduler sends: a pod's Neuron requests and identity, nodes' device-usage annotations.

Everything here is untrusted JSON; :class:`BadInput` carries a message that names what is wrong (the HTTP server
answers it with 400).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from lightkube.utils.quantity import parse_quantity

from neuron_dra.extender.placement import RESOURCES, Request

MAX_COUNT = 4096
#: the longest quantity text read (a whole count of at most MAX_COUNT fits in far fewer characters in any form)
MAX_QUANTITY_CHARS = 64


class BadInput(ValueError):
    """The request body is not what the extender API defines."""


@dataclass(frozen=True)
class PodInfo:
    """What the extender needs of a pod."""

    uid: str
    key: str  # namespace/name
    node: str
    phase: str
    created: str
    requests: tuple[Request, ...]


def _obj(value: Any, what: str) -> Mapping[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise BadInput(f"{what} must be a JSON object, not {type(value).__name__}")
    return value


def _count(value: Any, what: str) -> int:
    """A Kubernetes quantity (``4``, ``4000m``, ``1k``; lightkube's parser) that is a whole number of at most
    MAX_COUNT, as extended resources are."""
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        raise BadInput(f"{what} must be a whole number, not {str(value)[:30]!r}")
    text = value if isinstance(value, str) else str(value) if abs(value) <= MAX_COUNT else "too large"
    try:
        number = parse_quantity(text) if len(text) <= MAX_QUANTITY_CHARS and text.isascii() else None
    except ValueError:
        number = None
    if number is None or number != number.to_integral_value() or not 0 <= number <= MAX_COUNT:
        raise BadInput(f"{what} must be a whole number of at most {MAX_COUNT}, not {text[:30]!r}")
    return int(number)


def container_requests(pod: Mapping[str, Any]) -> tuple[Request, ...]:
    """Every regular container's Neuron request (limits; requests when no limit), in container order."""
    spec = _obj(pod.get("spec"), "pod.spec")
    containers = spec.get("containers") or []
    if not isinstance(containers, list):
        raise BadInput("pod.spec.containers must be a list")
    out: list[Request] = []
    for i, raw in enumerate(containers):
        ctr = _obj(raw, f"pod.spec.containers[{i}]")
        name = ctr.get("name")
        name = name[:63] if isinstance(name, str) else f"#{i}"
        resources = _obj(ctr.get("resources"), f"container {name} resources")
        limits = _obj(resources.get("limits"), f"container {name} resources.limits")
        requests = _obj(resources.get("requests"), f"container {name} resources.requests")
        for resource in RESOURCES:
            value = limits.get(resource, requests.get(resource))
            if value is None:
                continue
            count = _count(value, f"container {name} {resource}")
            if count:
                out.append(Request(name, resource, count))
    return tuple(out)


def pod_info(pod: Any) -> PodInfo:
    """The pod's identity, node, phase and Neuron requests."""
    pod = _obj(pod, "pod")
    meta = _obj(pod.get("metadata"), "pod.metadata")
    spec = _obj(pod.get("spec"), "pod.spec")
    status = _obj(pod.get("status"), "pod.status")
    name, namespace, uid = meta.get("name"), meta.get("namespace") or "default", meta.get("uid") or ""
    if not isinstance(name, str) or not name:
        raise BadInput("pod.metadata.name is missing")
    if not isinstance(namespace, str) or not isinstance(uid, str):
        raise BadInput("pod.metadata.namespace and uid must be strings")
    node = spec.get("nodeName") or ""
    phase = status.get("phase") or ""
    created = meta.get("creationTimestamp") or ""
    return PodInfo(uid[:128], f"{namespace[:253]}/{name[:253]}", node if isinstance(node, str) else "",
                   phase if isinstance(phase, str) else "", created if isinstance(created, str) else "",
                   container_requests(pod))


def node_name_and_annotation(node: Any, index: int, key: str) -> tuple[str, str | None]:
    """(name, value of annotation ``key`` or None) of one Node object of ``nodes.items``."""
    node = _obj(node, f"nodes.items[{index}]")
    meta = _obj(node.get("metadata"), f"nodes.items[{index}].metadata")
    name = meta.get("name")
    if not isinstance(name, str) or not name:
        raise BadInput(f"nodes.items[{index}].metadata.name is missing")
    annotations = _obj(meta.get("annotations"), f"node {name[:63]} annotations")
    value = annotations.get(key)
    return name, value if isinstance(value, str) else None


def device_plugin_away(node: Any) -> bool:
    """True when the Node's ``status.allocatable`` is listed and offers none of the Neuron resources (each absent or
    zero): no device plugin serves them there (the node was moved to the DRA driver, or its plugin is away). A Node
    without a listed allocatable, or with any other value, is not judged away."""
    status = node.get("status") if isinstance(node, dict) else None
    allocatable = status.get("allocatable") if isinstance(status, dict) else None
    if not isinstance(allocatable, dict):
        return False
    return all(allocatable.get(r) is None or (allocatable[r] in ("0", 0) and not isinstance(allocatable[r], bool))
               for r in RESOURCES)
