"""What discovery expects of an instance type: the catalog's layout (Neuron's section, :mod:`neuron_dra.facts`), or
for the few Neuron types the catalog does not describe, one derived from the architecture facts and the topology
kind.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from accel_core.awsfacts import catalog
from neuron_dra.facts.arch import ARCHES, EXTRA_TYPES, arch_from_device_name
from neuron_dra.facts.catalog import neuron_spec
from neuron_dra.topology import regular_neighbours

log = logging.getLogger(__name__)


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


def expected_layout(instance_type: str) -> ExpectedLayout | None:
    """The expected Neuron layout of ``instance_type`` (catalog first, then the extra types), None if unknown."""
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
        spec = neuron_spec(entry)
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
    extra = EXTRA_TYPES.get(instance_type)
    if extra is None:
        return None
    arch, count, kind = extra
    facts = ARCHES[arch]
    return ExpectedLayout(instance_type, arch, count, facts.physical_cores, facts.memory_bytes, kind,
                          connected=regular_neighbours(kind, count), source="built-in")
