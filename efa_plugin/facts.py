"""EFA's catalog sections (declared in :mod:`efa_plugin.accelerator`, data in ``efa_plugin/instances.yaml``): per
instance type the EFA devices, the non-EFA RDMA devices (``other_rdma``) and the GPUs an EFA sits near (``gpus``).

Which Neuron devices each EFA serves is not in the file: it comes from the AWS Neuron-to-EFA tables
(:mod:`accel_core.awsfacts.neuron_efa`), joined in here and checked against the type's Neuron section.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import cast

import msgspec

from accel_core.awsfacts import neuron_efa
from accel_core.awsfacts.catalog import Hex, InstanceType, PciFields, PciFunction, SectionContext, check_indices

#: the section keys this package declares
EFA, OTHER_RDMA, GPUS = "efa", "other_rdma", "gpus"


@dataclass(frozen=True)
class EfaDevice:
    """An EFA RDMA device and the accelerators it sits near (GPU indices or Neuron device indices)."""

    ibdev: str
    pci: PciFunction
    near_gpus: tuple[int, ...]
    near_neurons: tuple[int, ...]


@dataclass(frozen=True)
class EfaSpec:
    """All EFA devices of a type plus the per-generation attributes they share."""

    pci_device_id: str
    rate: str
    p2p: str
    devices: tuple[EfaDevice, ...]

    def pci_addresses(self) -> list[str]:
        return [d.pci.bdf for d in self.devices]

    def check(self, itype: InstanceType) -> None:
        """Near GPUs and Neuron devices exist; the Neuron-to-EFA table fits the EFAs and the Neuron devices; no
        RDMA device name twice (EFA and other RDMA)."""
        gpus, neuron = gpu_count(itype), len(getattr(itype.section("neuron"), "devices", ()))
        table = neuron_efa.efa_table(itype.name)
        if table is not None:
            unknown = sorted(set(table) - set(self.pci_addresses()))
            if unknown or (itype.section("neuron") is not None and len(table) != neuron):
                raise ValueError(f"the Neuron-to-EFA table ({len(table)} devices, EFAs {unknown or 'all present'}) "
                                 f"does not fit the catalog's {neuron} Neuron devices and EFAs")
        for dev in self.devices:
            if any(not 0 <= g < gpus for g in dev.near_gpus):
                raise ValueError(f"EFA {dev.ibdev} near_gpus {list(dev.near_gpus)} out of range")
        check_ibdevs(itype)


@dataclass(frozen=True)
class OtherRdmaDevice:
    """A non-EFA RDMA device (the mlx5 ``ibp*`` functions of p6-b200)."""

    ibdev: str
    pci: PciFunction
    vendor: str
    device: str
    driver: str
    node_type: str
    link_layer: str
    rate: str

    def pci_addresses(self) -> list[str]:
        return [self.pci.bdf]

    def check(self, itype: InstanceType) -> None:
        check_ibdevs(itype)


def check_ibdevs(itype: InstanceType) -> None:
    """No RDMA device name twice, EFA and other RDMA devices together."""
    ibdevs = [d.ibdev for d in getattr(efa_spec(itype), "devices", ())] + [d.ibdev for d in other_rdma(itype)]
    dupes = sorted({v for v in ibdevs if ibdevs.count(v) > 1})
    if dupes:
        raise ValueError(f"duplicate ibdev name {dupes}")


@dataclass(frozen=True)
class GpuDevice:
    index: int
    pci: PciFunction


@dataclass(frozen=True)
class GpuSpec:
    """The GPUs of a type (EFA discovery reports those on an EFA's PCIe root as ``near_gpus``)."""

    model: str
    pci_device_id: str
    devices: tuple[GpuDevice, ...]

    def pci_addresses(self) -> list[str]:
        return [d.pci.bdf for d in self.devices]


# --------------------------------------------------------------------------------------------- decoding


class _EfaEntry(PciFields, forbid_unknown_fields=True):
    ibdev: str
    near_gpus: tuple[int, ...] = ()


class EfaSection(msgspec.Struct, forbid_unknown_fields=True):
    """The ``efa:`` section of a type."""

    pci_device_id: Hex
    rate: str
    devices: tuple[_EfaEntry, ...]
    p2p: str = ""

    def __post_init__(self) -> None:
        if not self.devices:
            raise ValueError("an efa section needs at least one device")

    def resolve(self, ctx: SectionContext) -> EfaSpec:
        table = neuron_efa.efa_table(ctx.instance_type) or ()
        return EfaSpec(self.pci_device_id, self.rate, self.p2p, tuple(
            EfaDevice(d.ibdev, d.pci(), d.near_gpus, tuple(i for i, bdf in enumerate(table) if bdf == d.bdf))
            for d in self.devices))


class _OtherRdmaEntry(PciFields, forbid_unknown_fields=True):
    ibdev: str
    vendor: Hex
    device: Hex
    driver: str
    node_type: str
    link_layer: str
    rate: str

    def resolve(self, ctx: SectionContext) -> OtherRdmaDevice:
        return OtherRdmaDevice(self.ibdev, self.pci(), self.vendor, self.device, self.driver, self.node_type,
                               self.link_layer, self.rate)


#: The ``other_rdma:`` section: a list of non-EFA RDMA devices.
OtherRdmaList = tuple[_OtherRdmaEntry, ...]


class _GpuEntry(PciFields, forbid_unknown_fields=True):
    index: int


class GpuSection(msgspec.Struct, forbid_unknown_fields=True):
    """The ``gpus:`` section of a type."""

    model: str
    pci_device_id: Hex
    devices: tuple[_GpuEntry, ...] = ()

    def __post_init__(self) -> None:
        check_indices([g.index for g in self.devices])

    def resolve(self, ctx: SectionContext) -> GpuSpec:
        return GpuSpec(self.model, self.pci_device_id, tuple(GpuDevice(d.index, d.pci()) for d in self.devices))


# --------------------------------------------------------------------------------------------- typed views


def efa_spec(itype: InstanceType) -> EfaSpec | None:
    return cast("EfaSpec | None", itype.section(EFA))


def other_rdma(itype: InstanceType) -> tuple[OtherRdmaDevice, ...]:
    return cast("tuple[OtherRdmaDevice, ...]", itype.section(OTHER_RDMA) or ())


def gpu_spec(itype: InstanceType) -> GpuSpec | None:
    return cast("GpuSpec | None", itype.section(GPUS))


def efa_count(itype: InstanceType) -> int:
    spec = efa_spec(itype)
    return len(spec.devices) if spec else 0


def gpu_count(itype: InstanceType) -> int:
    spec = gpu_spec(itype)
    return len(spec.devices) if spec else 0


def neuron_efa_map(itype: InstanceType) -> dict[int, str]:
    """Neuron device index -> EFA BDF as the aws-neuron EFA mapping library has it ({} when it has no table)."""
    spec = efa_spec(itype)
    return {n: dev.pci.bdf for dev in (spec.devices if spec else ()) for n in dev.near_neurons}
