"""Neuron facts per architecture and per instance type, used as the fallback when host files are bad.

The fake-host catalog (``accel_core/fakehost/instances.yaml``) is the primary source for instance types; this
module adds the per-architecture defaults the driver and docs give (neuron.md section 3) and the few instance
types the catalog does not describe, and presents both through one small :class:`ExpectedLayout`.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass

from accel_core.fakehost import catalog
from neuron_dra.topology import regular_neighbours

log = logging.getLogger(__name__)

GIB = 1024**3

LNC_ARCHES = frozenset({"trn2", "trn3"})
"""Architectures with a Logical NeuronCore setting (Trainium2 and later)."""

DEFAULT_LNC = 2
"""LNC on Trainium2/3 when ``/opt/aws/neuron/logical_nc_config`` does not say otherwise."""


@dataclass(frozen=True)
class ArchFacts:
    """What one Neuron architecture looks like: physical NeuronCores and memory per device."""

    arch: str
    physical_cores: int
    memory_bytes: int
    device_name: str


ARCHES: dict[str, ArchFacts] = {
    "inf1": ArchFacts("inf1", 4, 8 * GIB, "Inferentia"),
    "inf2": ArchFacts("inf2", 2, 32 * GIB, "Inferentia2"),
    "trn1": ArchFacts("trn1", 2, 32 * GIB, "Trainium1"),
    "trn2": ArchFacts("trn2", 8, 96 * GIB, "Trainium2"),
    "trn3": ArchFacts("trn3", 8, 144 * GIB, "Trainium3"),
}

_DEVICE_NAME_TO_ARCH = {facts.device_name.lower(): arch for arch, facts in ARCHES.items()}
_FAMILY_RE = re.compile(r"^(?:ml\.)?(inf|trn)(\d)")


@dataclass(frozen=True)
class ExpectedLayout:
    """What an instance type should have: architecture, devices, topology kind, neighbour lists, PCI facts."""

    instance_type: str
    arch: str
    device_count: int
    physical_cores: int
    memory_bytes: int
    topology: str
    connected: tuple[tuple[int, ...], ...] = ()
    pci_addresses: tuple[str, ...] = ()
    driver_version: str | None = None
    source: str = "catalog"


# Types the catalog does not describe (neuron.md section 3); neighbour lists are derived from the kind.
_EXTRA_TYPES: dict[str, tuple[str, int, str]] = {
    "inf1.2xlarge": ("inf1", 1, "single"),
    "inf1.6xlarge": ("inf1", 4, "ring"),
    "inf1.24xlarge": ("inf1", 16, "ring"),
    "inf2.8xlarge": ("inf2", 1, "single"),
}


def arch_from_device_name(name: str) -> str | None:
    """``Trainium2`` -> ``trn2``; None for an unknown name."""
    return _DEVICE_NAME_TO_ARCH.get(name.strip().lower())


def arch_from_instance_type(instance_type: str) -> str | None:
    """``trn2u.48xlarge`` -> ``trn2``, ``ml.inf2.xlarge`` -> ``inf2``; None for non-Neuron types."""
    m = _FAMILY_RE.match(instance_type.strip().lower())
    return f"{m.group(1)}{m.group(2)}" if m else None


def expected_layout(instance_type: str) -> ExpectedLayout | None:
    """The expected Neuron layout of ``instance_type`` (catalog first, then this module), None if unknown."""
    if not instance_type:
        return None
    try:
        entry = catalog.get(instance_type)
    except KeyError:
        entry = None
    except catalog.CatalogError as exc:  # a broken packaged catalog must not take discovery down
        log.warning("instance catalog unreadable; using built-in facts", extra={"kv": {"error": str(exc)}})
        entry = None
    if entry is not None:
        spec = entry.neuron
        if spec is None:
            return ExpectedLayout(instance_type, "", 0, 0, 0, "none")
        arch = arch_from_device_name(spec.device_name) or spec.arch_instance_type.lower()
        return ExpectedLayout(
            instance_type=instance_type,
            arch=arch,
            device_count=len(spec.devices),
            physical_cores=spec.cores_per_device,
            memory_bytes=spec.memory_bytes,
            topology=spec.topology,
            connected=tuple(tuple(sorted(d.connected)) for d in spec.devices),
            pci_addresses=tuple(d.pci.bdf for d in spec.devices),
            driver_version=spec.driver_version,
        )
    extra = _EXTRA_TYPES.get(instance_type)
    if extra is None:
        return None
    arch, count, kind = extra
    facts = ARCHES[arch]
    return ExpectedLayout(instance_type, arch, count, facts.physical_cores, facts.memory_bytes, kind,
                          connected=regular_neighbours(kind, count), source="built-in")
