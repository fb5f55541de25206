"""Neuron's catalog section (declared in :mod:`neuron_dra.accelerator`, data in ``neuron_dra/facts/instances.yaml``):
per instance type, the Neuron devices and the attributes the driver reports for them."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, cast

import msgspec

from accel_core.awsfacts import neuron_efa
from accel_core.awsfacts.catalog import Hex, InstanceType, PciFields, PciFunction, SectionContext, check_indices

#: the section key this package declares
NEURON = "neuron"


@dataclass(frozen=True)
class NeuronDevice:
    """A Neuron device: index, PCI function and the driver's ``connected_devices`` list (driver order)."""

    index: int
    pci: PciFunction
    connected: tuple[int, ...]


@dataclass(frozen=True)
class NeuronSpec:
    """Neuron devices of a type and the attributes the driver reports for them."""

    pci_device_id: str
    pci_driver: str
    arch_type: str
    core_arch_type: str
    arch_instance_type: str
    device_name: str
    cores_per_device: int
    memory_bytes: int
    lnc_default: int | None
    topology: str
    efa_mapping_library: bool
    """True when the AWS Neuron-to-EFA tables cover the type (from neuron_efa, not from the YAML)."""
    ultraserver: bool
    driver_version: str
    devices: tuple[NeuronDevice, ...]

    def pci_addresses(self) -> list[str]:
        return [d.pci.bdf for d in self.devices]


class _Architecture(msgspec.Struct, forbid_unknown_fields=True):
    arch_type: str
    core_arch_type: str
    instance_type: str
    device_name: str


class _NeuronEntry(PciFields, forbid_unknown_fields=True):
    index: int
    connected: tuple[int, ...] = ()


class NeuronSection(msgspec.Struct, forbid_unknown_fields=True):
    """The ``neuron:`` section of a type (driver version and PCI driver default to the file's ``defaults``)."""

    pci_device_id: Hex
    architecture: _Architecture
    cores_per_device: Annotated[int, msgspec.Meta(ge=1, le=8)]
    memory_bytes: int
    topology: str
    devices: tuple[_NeuronEntry, ...] = ()
    lnc_default: int | None = None
    ultraserver: bool = False
    pci_driver: str | None = None
    driver_version: str | None = None

    def __post_init__(self) -> None:
        check_indices([d.index for d in self.devices])
        for dev in self.devices:
            bad = [c for c in dev.connected if not 0 <= c < len(self.devices) or c == dev.index]
            if bad:
                raise ValueError(f"devices[{dev.index}].connected: invalid neighbour ids {bad}")

    def resolve(self, ctx: SectionContext) -> NeuronSpec:
        arch = self.architecture
        return NeuronSpec(
            pci_device_id=self.pci_device_id,
            pci_driver=self.pci_driver or str(ctx.defaults["neuron_pci_driver"]),
            arch_type=arch.arch_type, core_arch_type=arch.core_arch_type, arch_instance_type=arch.instance_type,
            device_name=arch.device_name, cores_per_device=self.cores_per_device, memory_bytes=self.memory_bytes,
            lnc_default=self.lnc_default, topology=self.topology,
            efa_mapping_library=neuron_efa.efa_table(ctx.instance_type) is not None,
            ultraserver=self.ultraserver,
            driver_version=self.driver_version or str(ctx.defaults["neuron_driver_version"]),
            devices=tuple(NeuronDevice(d.index, d.pci(), d.connected) for d in self.devices))


# --------------------------------------------------------------------------------------------- typed views


def neuron_spec(itype: InstanceType) -> NeuronSpec | None:
    return cast("NeuronSpec | None", itype.section(NEURON))


def neuron_count(itype: InstanceType) -> int:
    spec = neuron_spec(itype)
    return len(spec.devices) if spec else 0


def cores_per_device(itype: InstanceType) -> int:
    spec = neuron_spec(itype)
    return spec.cores_per_device if spec else 0


def supports_lnc(itype: InstanceType) -> bool:
    """The type has a Logical NeuronCore setting (Trainium2 and later)."""
    spec = neuron_spec(itype)
    return spec is not None and spec.lnc_default is not None
