"""Neuron facts per architecture (neuron.md sections 1.3 and 3), and the Neuron instance types the catalog does not
describe device by device.

Discovery uses them as fallbacks when host files are bad; the fake host and the catalog agree with them.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

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

#: Neuron instance types the catalog does not describe: (arch, device count, topology kind).
EXTRA_TYPES: dict[str, tuple[str, int, str]] = {
    "inf1.2xlarge": ("inf1", 1, "single"),
    "inf1.6xlarge": ("inf1", 4, "ring"),
    "inf1.24xlarge": ("inf1", 16, "ring"),
    "inf2.8xlarge": ("inf2", 1, "single"),
}

_DEVICE_NAME_TO_ARCH = {facts.device_name.lower(): arch for arch, facts in ARCHES.items()}
_FAMILY_RE = re.compile(r"^(?:ml\.)?(inf|trn)(\d)")


def arch_from_device_name(name: str) -> str | None:
    """``Trainium2`` -> ``trn2``; None for an unknown name."""
    return _DEVICE_NAME_TO_ARCH.get(name.strip().lower())


def arch_from_instance_type(instance_type: str) -> str | None:
    """``trn2u.48xlarge`` -> ``trn2``, ``ml.inf2.xlarge`` -> ``inf2``; None for non-Neuron types."""
    m = _FAMILY_RE.match(instance_type.strip().lower())
    return f"{m.group(1)}{m.group(2)}" if m else None
