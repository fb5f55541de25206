"""Typed view of ``instances.yaml``: the hardware each catalog instance type has.

The YAML holds the per-type hardware; which Neuron devices each EFA serves comes from the AWS Neuron-to-EFA
tables in :mod:`accel_core.awsfacts.neuron_efa` (one copy of that fact), which this module joins in and
cross-checks. Use :func:`get` for one type and :func:`names` for the list. A malformed catalog raises
:class:`CatalogError` naming the type and field.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cache, lru_cache
from importlib import resources
from pathlib import Path
from typing import Annotated, Any, cast

import msgspec
import yaml

from accel_core.awsfacts import neuron_efa
from accel_core.registry import accelerators, load_ref


class CatalogError(ValueError):
    """The catalog file is malformed; the message names the instance type and the field."""


class UnknownInstanceType(KeyError):
    """An instance type that is not in the catalog; the message lists the known ones."""

    def __init__(self, name: str, known: tuple[str, ...]) -> None:
        super().__init__(name)
        self.name = name
        self.known = known

    def __str__(self) -> str:
        return f"unknown instance type {self.name!r}; known types: {', '.join(self.known)}"


@dataclass(frozen=True)
class PciFunction:
    """One PCI function: address, PCIe root (``pci0000:XX``) and NUMA node (-1 when unknown)."""

    bdf: str
    root: str
    numa_node: int

    @property
    def bus(self) -> int:
        return int(self.bdf.split(":")[1], 16)

    @property
    def root_bus(self) -> int:
        return int(self.root.split(":")[1], 16)


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


@dataclass(frozen=True)
class GpuDevice:
    index: int
    pci: PciFunction


@dataclass(frozen=True)
class GpuSpec:
    model: str
    pci_device_id: str
    devices: tuple[GpuDevice, ...]


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
    """True when the AWS Neuron-to-EFA tables cover the type (filled in from neuron_efa, not from the YAML)."""
    ultraserver: bool
    driver_version: str
    devices: tuple[NeuronDevice, ...]


@dataclass(frozen=True)
class InstanceType:
    """Everything the fake host builder needs to know about one EC2 instance type.

    ``sections`` holds each registered accelerator's section, decoded by the Struct its declaration names
    (:mod:`accel_core.registry`); ``efa``, ``other_rdma`` and ``neuron`` are typed views of three of them."""

    name: str
    family: str
    gpus: GpuSpec | None = None
    sections: Mapping[str, Any] = field(default_factory=dict)

    def section(self, key: str) -> Any:
        """An accelerator's section (None when the type has none)."""
        return self.sections.get(key)

    @property
    def efa(self) -> EfaSpec | None:
        return cast("EfaSpec | None", self.sections.get("efa"))

    @property
    def other_rdma(self) -> tuple[OtherRdmaDevice, ...]:
        return cast("tuple[OtherRdmaDevice, ...]", self.sections.get("other_rdma", ()))

    @property
    def neuron(self) -> NeuronSpec | None:
        return cast("NeuronSpec | None", self.sections.get("neuron"))

    @property
    def efa_count(self) -> int:
        return len(self.efa.devices) if self.efa else 0

    @property
    def gpu_count(self) -> int:
        return len(self.gpus.devices) if self.gpus else 0

    @property
    def neuron_count(self) -> int:
        return len(self.neuron.devices) if self.neuron else 0

    @property
    def cores_per_device(self) -> int:
        return self.neuron.cores_per_device if self.neuron else 0

    @property
    def supports_lnc(self) -> bool:
        return self.neuron is not None and self.neuron.lnc_default is not None

    def neuron_efa_map(self) -> dict[int, str]:
        """Neuron device index -> EFA BDF as the aws-neuron EFA mapping library has it ({} if not listed)."""
        if self.neuron is None or self.efa is None or not self.neuron.efa_mapping_library:
            return {}
        return {n: dev.pci.bdf for dev in self.efa.devices for n in dev.near_neurons}


# --------------------------------------------------------------------------------------------- decoding

Bdf = Annotated[str, msgspec.Meta(pattern=r"^[0-9a-f]{4}:[0-9a-f]{2}:[0-1][0-9a-f]\.[0-7]$")]
Root = Annotated[str, msgspec.Meta(pattern=r"^pci[0-9a-f]{4}:[0-9a-f]{2}$")]
Hex = Annotated[str, msgspec.Meta(pattern=r"^0x[0-9a-f]{4}$")]


class _Pci(msgspec.Struct, forbid_unknown_fields=True):
    """The PCI fields every device entry carries."""

    bdf: Bdf
    root: Root
    numa: int

    def pci(self) -> PciFunction:
        fn = PciFunction(self.bdf, self.root, self.numa)
        if fn.bdf[:4] != fn.root[3:7] or fn.bus < fn.root_bus:
            raise ValueError(f"{fn.bdf} cannot sit below PCIe root {fn.root}")
        return fn

    def __post_init__(self) -> None:
        self.pci()


class _EfaEntry(_Pci, forbid_unknown_fields=True):
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

    def resolve(self, defaults: dict[str, Any]) -> EfaSpec:
        return EfaSpec(self.pci_device_id, self.rate, self.p2p,
                       tuple(EfaDevice(d.ibdev, d.pci(), d.near_gpus, ()) for d in self.devices))


class _OtherRdmaEntry(_Pci, forbid_unknown_fields=True):
    ibdev: str
    vendor: Hex
    device: Hex
    driver: str
    node_type: str
    link_layer: str
    rate: str


    def resolve(self, defaults: dict[str, Any]) -> OtherRdmaDevice:
        return OtherRdmaDevice(self.ibdev, self.pci(), self.vendor, self.device, self.driver, self.node_type,
                               self.link_layer, self.rate)


#: The ``other_rdma:`` section: a list of non-EFA RDMA devices.
OtherRdmaList = tuple[_OtherRdmaEntry, ...]


def _check_indices(indices: list[int]) -> None:
    if indices != list(range(len(indices))):
        raise ValueError(f"device indices must be 0..{len(indices) - 1} in order, got {indices}")


class _GpuEntry(_Pci, forbid_unknown_fields=True):
    index: int


class _GpuSection(msgspec.Struct, forbid_unknown_fields=True):
    model: str
    pci_device_id: Hex
    devices: tuple[_GpuEntry, ...] = ()

    def __post_init__(self) -> None:
        _check_indices([g.index for g in self.devices])


class _Architecture(msgspec.Struct, forbid_unknown_fields=True):
    arch_type: str
    core_arch_type: str
    instance_type: str
    device_name: str


class _NeuronEntry(_Pci, forbid_unknown_fields=True):
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
        _check_indices([d.index for d in self.devices])
        for dev in self.devices:
            bad = [c for c in dev.connected if not 0 <= c < len(self.devices) or c == dev.index]
            if bad:
                raise ValueError(f"devices[{dev.index}].connected: invalid neighbour ids {bad}")

    def resolve(self, defaults: dict[str, Any]) -> NeuronSpec:
        arch = self.architecture
        return NeuronSpec(
            pci_device_id=self.pci_device_id, pci_driver=self.pci_driver or str(defaults["neuron_pci_driver"]),
            arch_type=arch.arch_type, core_arch_type=arch.core_arch_type, arch_instance_type=arch.instance_type,
            device_name=arch.device_name, cores_per_device=self.cores_per_device, memory_bytes=self.memory_bytes,
            lnc_default=self.lnc_default, topology=self.topology, efa_mapping_library=False,
            ultraserver=self.ultraserver,
            driver_version=self.driver_version or str(defaults["neuron_driver_version"]),
            devices=tuple(NeuronDevice(d.index, d.pci(), d.connected) for d in self.devices))


class _TypeHead(msgspec.Struct):
    """The fields of a type no accelerator owns; every other key is a section an accelerator registers."""

    family: str
    gpus: _GpuSection | None = None


_HEAD_FIELDS = frozenset(_TypeHead.__struct_fields__)


@cache
def _section_types() -> dict[str, type[Any]]:
    """Section key -> its Struct, from the registered accelerators (:mod:`accel_core.registry`)."""
    return {key: load_ref(ref) for acc in accelerators() for key, ref in acc.catalog_sections.items()}


def _decode(kind: Any, raw: Any, where: str, key: str = "") -> Any:
    """``raw`` as ``kind``; a CatalogError such as ``instances.yaml: z1.big: Expected `str` matching regex ... -
    at `neuron.devices[0].bdf``` otherwise."""
    try:
        return msgspec.convert(raw, kind)
    except msgspec.ValidationError as exc:
        raise CatalogError(f"{where}: {str(exc).replace('`$', f'`{key}' if key else '`')}") from None


def _resolve(section: Any, defaults: dict[str, Any]) -> Any:
    if isinstance(section, tuple):
        return tuple(_resolve(item, defaults) for item in section)
    resolve = getattr(section, "resolve", None)
    return resolve(defaults) if resolve is not None else section


def _parse_type(name: str, raw: Any, defaults: dict[str, Any], source: str) -> InstanceType:
    where = f"{source}: {name}"
    if not isinstance(raw, dict):
        raise CatalogError(f"{where}: expected a mapping, got {type(raw).__name__}")
    head = _decode(_TypeHead, {k: v for k, v in raw.items() if k in _HEAD_FIELDS}, where)
    kinds = _section_types()
    sections: dict[str, Any] = {}
    for key, body in raw.items():
        if key in _HEAD_FIELDS or body is None:
            continue
        kind = kinds.get(key)
        if kind is None:
            raise CatalogError(f"{where}: unknown section {key!r} (no registered accelerator declares it; "
                               f"known: {', '.join(sorted(kinds))})")
        sections[key] = _resolve(_decode(kind, body, where, key), defaults)
    gpus = None
    if head.gpus is not None:
        g = head.gpus
        gpus = GpuSpec(g.model, g.pci_device_id, tuple(GpuDevice(d.index, d.pci()) for d in g.devices))
    itype = InstanceType(name=name, family=head.family, gpus=gpus, sections=sections)
    itype = _with_neuron_efa_table(itype)
    _check_cross_refs(itype)
    return itype


def _with_neuron_efa_table(t: InstanceType) -> InstanceType:
    """Join in the AWS Neuron-to-EFA table: each EFA's ``near_neurons`` and the Neuron spec's flag."""
    table = neuron_efa.efa_table(t.name)
    if table is None or t.neuron is None or t.efa is None:
        return t
    efa_bdfs = {d.pci.bdf for d in t.efa.devices}
    unknown = sorted(set(table) - efa_bdfs)
    if unknown or len(table) != len(t.neuron.devices):
        raise CatalogError(f"instance type {t.name}: the Neuron-to-EFA table ({len(table)} devices, EFAs "
                           f"{unknown or 'all present'}) does not fit the catalog's {len(t.neuron.devices)} Neuron "
                           "devices and EFAs")
    devices = tuple(dataclasses.replace(d, near_neurons=tuple(i for i, b in enumerate(table) if b == d.pci.bdf))
                    for d in t.efa.devices)
    return dataclasses.replace(t, sections={**t.sections, "efa": dataclasses.replace(t.efa, devices=devices),
                                            "neuron": dataclasses.replace(t.neuron, efa_mapping_library=True)})


def _check_cross_refs(t: InstanceType) -> None:
    where = f"instance type {t.name}"
    bdfs = [d.pci.bdf for d in t.other_rdma]
    ibdevs = [d.ibdev for d in t.other_rdma]
    if t.efa:
        bdfs += [d.pci.bdf for d in t.efa.devices]
        ibdevs += [d.ibdev for d in t.efa.devices]
        for dev in t.efa.devices:
            if any(not 0 <= g < t.gpu_count for g in dev.near_gpus):
                raise CatalogError(f"{where}: EFA {dev.ibdev} near_gpus {list(dev.near_gpus)} out of range")
            if any(not 0 <= n < t.neuron_count for n in dev.near_neurons):
                raise CatalogError(f"{where}: EFA {dev.ibdev} near_neurons {list(dev.near_neurons)} out of range")
    if t.gpus:
        bdfs += [g.pci.bdf for g in t.gpus.devices]
    if t.neuron:
        bdfs += [n.pci.bdf for n in t.neuron.devices]
    for label, values in (("PCI address", bdfs), ("ibdev name", ibdevs)):
        dupes = sorted({v for v in values if values.count(v) > 1})
        if dupes:
            raise CatalogError(f"{where}: duplicate {label} {dupes}")


# --------------------------------------------------------------------------------------------- public API

#: libyaml's safe loader parses the catalog ~10x faster than the pure-Python one (daemon start-up)
_SAFE_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def _packaged_text() -> str:
    return resources.files("accel_core.awsfacts").joinpath("instances.yaml").read_text(encoding="utf-8")


def _yaml(text: str, source: str) -> Any:
    try:
        return yaml.load(text, Loader=_SAFE_LOADER)  # noqa: S506 - a safe loader (libyaml's when present)
    except yaml.YAMLError as exc:
        raise CatalogError(f"{source}: not valid YAML: {exc}") from exc


def _top(data: Any, source: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """``(defaults, types)`` of a parsed catalog file."""
    if not isinstance(data, dict):
        raise CatalogError(f"{source}: expected a mapping, got {type(data).__name__}")
    defaults, types = data.get("defaults") or {}, data.get("types")
    if not isinstance(defaults, dict):
        raise CatalogError(f"{source}: defaults: expected a mapping")
    if not isinstance(types, dict):
        raise CatalogError(f"{source}: missing 'types'")
    return defaults, types


def _parse_file(text: str, source: str, defaults: Mapping[str, Any] = {}) -> dict[str, InstanceType]:
    own, types = _top(_yaml(text, source), source)
    merged = {**defaults, **own}
    return {str(name): _parse_type(str(name), body, merged, source) for name, body in types.items()}


def load(path: Path | None = None) -> dict[str, InstanceType]:
    """Parse a catalog file (the packaged ``instances.yaml`` and the registered accelerators' catalog files by
    default) into ``{name: InstanceType}``."""
    if path is not None:
        return _parse_file(path.read_text(encoding="utf-8"), str(path), _packaged_defaults())
    out = _parse_file(_packaged_text(), "instances.yaml")
    for source, extra in _accelerator_catalogs():
        for name, itype in extra.items():
            if name in out:
                raise CatalogError(f"{source}: instance type {name} is already in the catalog")
            out[name] = itype
    return out


def _packaged_defaults() -> dict[str, Any]:
    return _top(_yaml(_sections()[0] + "types: {}\n", "instances.yaml"), "instances.yaml")[0]


@cache
def _accelerator_catalogs() -> tuple[tuple[str, dict[str, InstanceType]], ...]:
    """Each registered accelerator's own catalog file, parsed (with the packaged defaults)."""
    out = []
    for acc in accelerators():
        if acc.catalog_file is None:
            continue
        package, _, name = acc.catalog_file.partition(":")
        source = f"{acc.name} catalog {acc.catalog_file}"
        try:
            text = resources.files(package).joinpath(name).read_text(encoding="utf-8")
        except (OSError, ModuleNotFoundError) as exc:
            raise CatalogError(f"{source}: cannot read it ({exc})") from None
        out.append((source, _parse_file(text, source, _packaged_defaults())))
    return tuple(out)


@lru_cache(maxsize=1)
def _default_catalog() -> dict[str, InstanceType]:
    return load()


def names() -> tuple[str, ...]:
    """Instance types in catalog order."""
    return tuple(_default_catalog())


#: a type's first line in the packaged file: two spaces, the name, a colon (see the ``types:`` section)
_TYPE_LINE = re.compile(r"^  ([A-Za-z0-9][A-Za-z0-9.-]*):[ \t]*(?:#.*)?$")


@lru_cache(maxsize=1)
def _sections() -> tuple[str, dict[str, str]]:
    """The packaged file cut into its head (everything before ``types:``) and the text of each type's block.

    A daemon needs one type, and libyaml takes ~25 ms for the whole file at start-up; a block is a few hundred
    lines at most. tests/unit/test_catalog* check that every type parsed alone equals the whole-file parse.
    """
    lines = _packaged_text().splitlines(keepends=True)
    try:
        at = next(i for i, line in enumerate(lines) if line.rstrip() == "types:")
    except StopIteration:
        raise CatalogError("instances.yaml: missing 'types'") from None
    blocks: dict[str, list[str]] = {}
    current: list[str] | None = None
    for line in lines[at + 1:]:
        match = _TYPE_LINE.match(line)
        if match:
            current = blocks.setdefault(match.group(1), [])
        if current is not None:
            current.append(line)
    return "".join(lines[:at]), {name: "".join(block) for name, block in blocks.items()}


@cache
def _one(instance_type: str) -> InstanceType:
    head, blocks = _sections()
    block = blocks.get(instance_type)
    if block is None:
        for _source, extra in _accelerator_catalogs():
            if instance_type in extra:
                return extra[instance_type]
        known = (*blocks, *(n for _s, extra in _accelerator_catalogs() for n in extra))
        raise UnknownInstanceType(instance_type, known)
    parsed = _parse_file(head + "types:\n" + block, "instances.yaml")
    if list(parsed) != [instance_type]:
        raise CatalogError(f"instances.yaml: the block of {instance_type} does not parse on its own")
    return parsed[instance_type]


def get(instance_type: str) -> InstanceType:
    """The catalog entry for ``instance_type``; :class:`UnknownInstanceType` (a KeyError) if absent.

    Only that type's block of the packaged file is parsed (unless the whole catalog is loaded already)."""
    if _default_catalog.cache_info().currsize:
        catalog = _default_catalog()
        try:
            return catalog[instance_type]
        except KeyError:
            raise UnknownInstanceType(instance_type, tuple(catalog)) from None
    return _one(instance_type)
