"""The ``neuron.amazonaws.com/device-usage`` Node annotation: which Neuron devices and cores are in use on a node.

The device plugin writes it on its own Node (it knows usage from Allocate and the kubelet's PodResources); the
scheduler extender reads it. It replaces the usage maps a scheduler keeps for itself, which go stale when that
scheduler restarts. The value is compact JSON::

    {"v": 1, "generation": 7, "updated": 1764730000.5, "instanceType": "trn2.48xlarge", "topology": "torus4x4",
     "devices": 16, "coresPerDevice": 4, "unhealthy": [3], "neuron": [0, 1], "neuroncore": [8, 9],
     "pods": {"ns/name": {"neuron": [0, 1]}}, "pending": 0}

``neuron``/``neuroncore`` are the IDs in use (device indices; global logical core indices), ``pods`` attributes
the IDs PodResources reports to pods (``pending`` counts Allocates it does not show yet). ``v`` is the schema
version (a reader refuses others); ``generation`` grows with every change the writer makes.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

from neuron_dra import NEURON_RESOURCE, NEURONCORE_RESOURCE
from neuron_dra.topology import KINDS, Topology, TopologyKind

USAGE_ANNOTATION = "neuron.amazonaws.com/device-usage"
SCHEMA_VERSION = 1
MAX_DEVICES = 1024
MAX_CORES_PER_DEVICE = 64
NEURON = NEURON_RESOURCE
NEURONCORE = NEURONCORE_RESOURCE
RESOURCES = (NEURON, NEURONCORE)


class UsageFormatError(ValueError):
    """The annotation is not a device-usage document this reader understands."""


@dataclass(frozen=True)
class DeviceUsage:
    """One node's Neuron devices and what is in use (see the module docstring)."""

    topology_kind: TopologyKind
    devices: int
    cores_per_device: int
    neuron: frozenset[int] = frozenset()
    neuroncore: frozenset[int] = frozenset()
    unhealthy: frozenset[int] = frozenset()
    #: "namespace/name" -> {"neuron": device IDs, "neuroncore": core IDs}
    pods: Mapping[str, Mapping[str, tuple[int, ...]]] = field(default_factory=dict)
    instance_type: str = ""
    pending: int = 0
    generation: int = 0
    updated: float = 0.0

    def topology(self) -> Topology:
        kind = self.topology_kind if (self.topology_kind != "torus4x4" or self.devices == 16) else "none"
        return _topology(kind, self.devices)

    def content(self) -> dict[str, Any]:
        """Everything but ``generation`` and ``updated`` (what decides whether a new version is due)."""
        return {
            "v": SCHEMA_VERSION, "instanceType": self.instance_type, "topology": self.topology_kind,
            "devices": self.devices, "coresPerDevice": self.cores_per_device, "unhealthy": sorted(self.unhealthy),
            "neuron": sorted(self.neuron), "neuroncore": sorted(self.neuroncore),
            "pods": {p: {r: sorted(ids) for r, ids in sorted(res.items())} for p, res in sorted(self.pods.items())},
            "pending": self.pending,
        }

    def to_json(self) -> str:
        doc = {"v": SCHEMA_VERSION, "generation": self.generation, "updated": round(self.updated, 3),
               **self.content()}
        return json.dumps(doc, separators=(",", ":"))


@lru_cache(maxsize=64)
def _topology(kind: TopologyKind, devices: int) -> Topology:
    """One shared Topology per shape (it caches its candidate sets)."""
    return Topology.regular(kind, devices, source="device-usage annotation")


def _int_list(doc: Mapping[str, Any], key: str, limit: int, where: str) -> frozenset[int]:
    raw = doc.get(key, [])
    if not isinstance(raw, list) or len(raw) > limit:
        raise UsageFormatError(f"{where}: {key!r} must be a list of at most {limit} integers")
    out = set()
    for item in raw:
        if isinstance(item, bool) or not isinstance(item, int) or not 0 <= item < limit:
            raise UsageFormatError(f"{where}: {key!r} holds {str(item)[:20]!r}, not an integer in 0..{limit - 1}")
        out.add(item)
    return frozenset(out)


def _count(doc: Mapping[str, Any], key: str, maximum: int, where: str) -> int:
    value = doc.get(key)
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= maximum:
        raise UsageFormatError(f"{where}: {key!r} must be an integer in 0..{maximum}, not {str(value)[:20]!r}")
    return value


def parse_usage(text: str, where: str = USAGE_ANNOTATION) -> DeviceUsage:
    """Parse an annotation value; UsageFormatError saying what is wrong (``where`` names the node)."""
    if len(text) > 1 << 20:
        raise UsageFormatError(f"{where}: {len(text)} bytes is too long for a device-usage document")
    try:
        doc = json.loads(text)
    except ValueError as exc:
        raise UsageFormatError(f"{where}: not JSON ({exc})") from None
    if not isinstance(doc, dict):
        raise UsageFormatError(f"{where}: must be a JSON object")
    if doc.get("v") != SCHEMA_VERSION:
        raise UsageFormatError(f"{where}: schema version {str(doc.get('v'))[:20]!r} is not {SCHEMA_VERSION}")
    kind = doc.get("topology")
    if kind not in KINDS:
        raise UsageFormatError(f"{where}: topology {str(kind)[:20]!r} is not one of {', '.join(KINDS)}")
    devices = _count(doc, "devices", MAX_DEVICES, where)
    per = _count(doc, "coresPerDevice", MAX_CORES_PER_DEVICE, where)
    pods_raw = doc.get("pods", {})
    if not isinstance(pods_raw, dict):
        raise UsageFormatError(f"{where}: 'pods' must be an object")
    pods: dict[str, dict[str, tuple[int, ...]]] = {}
    for name, res in pods_raw.items():
        if not isinstance(res, dict):
            raise UsageFormatError(f"{where}: pods[{name[:60]!r}] must be an object")
        pods[name] = {
            "neuron": tuple(sorted(_int_list(res, "neuron", max(devices, 1), f"{where} pods[{name[:60]!r}]"))),
            "neuroncore": tuple(sorted(_int_list(res, "neuroncore", max(devices * per, 1),
                                               f"{where} pods[{name[:60]!r}]"))),
        }
    generation = doc.get("generation", 0)
    updated = doc.get("updated", 0.0)
    itype = doc.get("instanceType", "")
    return DeviceUsage(
        topology_kind=kind, devices=devices, cores_per_device=per,
        neuron=_int_list(doc, "neuron", max(devices, 1), where),
        neuroncore=_int_list(doc, "neuroncore", max(devices * per, 1), where),
        unhealthy=_int_list(doc, "unhealthy", max(devices, 1), where),
        pods=pods, instance_type=itype if isinstance(itype, str) else "",
        pending=doc["pending"] if isinstance(doc.get("pending"), int) else 0,
        generation=generation if isinstance(generation, int) and not isinstance(generation, bool) else 0,
        updated=float(updated) if isinstance(updated, (int, float)) else 0.0,
    )
