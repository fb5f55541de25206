"""Typed view of ``instances.yaml``: the hardware each catalog instance type has.

The YAML holds the per-type hardware; which Neuron devices each EFA serves comes from the AWS Neuron-to-EFA
tables in :mod:`accel_core.awsfacts.neuron_efa` (one copy of that fact), which this module joins in and
cross-checks. Use :func:`get` for one type and :func:`names` for the list. A malformed catalog raises
:class:`CatalogError` naming the type and field.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass
from functools import cache, lru_cache
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from accel_core.awsfacts import neuron_efa

_BDF_RE = re.compile(r"^[0-9a-f]{4}:[0-9a-f]{2}:[0-1][0-9a-f]\.[0-7]$")
_ROOT_RE = re.compile(r"^pci[0-9a-f]{4}:[0-9a-f]{2}$")
_HEX_RE = re.compile(r"^0x[0-9a-f]{4}$")


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
    """Everything the fake host builder needs to know about one EC2 instance type."""

    name: str
    family: str
    efa: EfaSpec | None
    other_rdma: tuple[OtherRdmaDevice, ...]
    gpus: GpuSpec | None
    neuron: NeuronSpec | None

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


# --------------------------------------------------------------------------------------------- parsing helpers


class _Fields:
    """Typed accessors over one YAML mapping; every error names the type and the field path."""

    def __init__(self, data: Any, where: str) -> None:
        if not isinstance(data, dict):
            raise CatalogError(f"{where}: expected a mapping, got {type(data).__name__}")
        self.data: dict[str, Any] = data
        self.where = where

    def _get(self, key: str) -> Any:
        if key not in self.data:
            raise CatalogError(f"{self.where}: missing field {key!r}")
        return self.data[key]

    def str_(self, key: str, pattern: re.Pattern[str] | None = None, default: str | None = None) -> str:
        if default is not None and key not in self.data:
            return default
        value = self._get(key)
        if not isinstance(value, str):
            raise CatalogError(f"{self.where}.{key}: expected a string, got {value!r}")
        if pattern is not None and not pattern.match(value):
            raise CatalogError(f"{self.where}.{key}: {value!r} does not match {pattern.pattern}")
        return value

    def int_(self, key: str) -> int:
        value = self._get(key)
        if not isinstance(value, int) or isinstance(value, bool):
            raise CatalogError(f"{self.where}.{key}: expected an integer, got {value!r}")
        return value

    def opt_int(self, key: str) -> int | None:
        return None if self.data.get(key) is None else self.int_(key)

    def bool_(self, key: str, default: bool = False) -> bool:
        value = self.data.get(key, default)
        if not isinstance(value, bool):
            raise CatalogError(f"{self.where}.{key}: expected true/false, got {value!r}")
        return value

    def ints(self, key: str) -> tuple[int, ...]:
        value = self.data.get(key, [])
        if not isinstance(value, list) or not all(isinstance(v, int) for v in value):
            raise CatalogError(f"{self.where}.{key}: expected a list of integers, got {value!r}")
        return tuple(value)

    def items(self, key: str) -> list[_Fields]:
        value = self.data.get(key, [])
        if not isinstance(value, list):
            raise CatalogError(f"{self.where}.{key}: expected a list")
        return [_Fields(v, f"{self.where}.{key}[{i}]") for i, v in enumerate(value)]

    def sub(self, key: str) -> _Fields | None:
        return None if self.data.get(key) is None else _Fields(self.data[key], f"{self.where}.{key}")

    def pci(self) -> PciFunction:
        fn = PciFunction(self.str_("bdf", _BDF_RE), self.str_("root", _ROOT_RE), self.int_("numa"))
        if fn.bdf[:4] != fn.root[3:7] or fn.bus < fn.root_bus:
            raise CatalogError(f"{self.where}: {fn.bdf} cannot sit below PCIe root {fn.root}")
        return fn


def _check_indices(where: str, indices: list[int]) -> None:
    if indices != list(range(len(indices))):
        raise CatalogError(f"{where}: device indices must be 0..{len(indices) - 1} in order, got {indices}")


def _parse_efa(f: _Fields) -> EfaSpec:
    devices = tuple(
        EfaDevice(d.str_("ibdev"), d.pci(), d.ints("near_gpus"), ()) for d in f.items("devices")
    )
    if not devices:
        raise CatalogError(f"{f.where}.devices: an efa section needs at least one device")
    return EfaSpec(f.str_("pci_device_id", _HEX_RE), f.str_("rate"), f.str_("p2p", default=""), devices)


def _parse_neuron(f: _Fields, defaults: _Fields) -> NeuronSpec:
    arch = f.sub("architecture")
    if arch is None:
        raise CatalogError(f"{f.where}: missing field 'architecture'")
    devices = tuple(NeuronDevice(d.int_("index"), d.pci(), d.ints("connected")) for d in f.items("devices"))
    _check_indices(f"{f.where}.devices", [d.index for d in devices])
    for dev in devices:
        bad = [c for c in dev.connected if not 0 <= c < len(devices) or c == dev.index]
        if bad:
            raise CatalogError(f"{f.where}.devices[{dev.index}].connected: invalid neighbour ids {bad}")
    spec = NeuronSpec(
        pci_device_id=f.str_("pci_device_id", _HEX_RE),
        pci_driver=f.str_("pci_driver", default=defaults.str_("neuron_pci_driver")),
        arch_type=arch.str_("arch_type"),
        core_arch_type=arch.str_("core_arch_type"),
        arch_instance_type=arch.str_("instance_type"),
        device_name=arch.str_("device_name"),
        cores_per_device=f.int_("cores_per_device"),
        memory_bytes=f.int_("memory_bytes"),
        lnc_default=f.opt_int("lnc_default"),
        topology=f.str_("topology"),
        efa_mapping_library=False,
        ultraserver=f.bool_("ultraserver"),
        driver_version=f.str_("driver_version", default=defaults.str_("neuron_driver_version")),
        devices=devices,
    )
    if not 1 <= spec.cores_per_device <= 8:
        raise CatalogError(f"{f.where}.cores_per_device: {spec.cores_per_device} is outside 1..8")
    return spec


def _parse_type(name: str, f: _Fields, defaults: _Fields) -> InstanceType:
    efa_f, gpus_f, neuron_f = f.sub("efa"), f.sub("gpus"), f.sub("neuron")
    gpus = None
    if gpus_f is not None:
        gdevs = tuple(GpuDevice(d.int_("index"), d.pci()) for d in gpus_f.items("devices"))
        _check_indices(f"{gpus_f.where}.devices", [g.index for g in gdevs])
        gpus = GpuSpec(gpus_f.str_("model"), gpus_f.str_("pci_device_id", _HEX_RE), gdevs)
    other = tuple(
        OtherRdmaDevice(
            ibdev=d.str_("ibdev"),
            pci=d.pci(),
            vendor=d.str_("vendor", _HEX_RE),
            device=d.str_("device", _HEX_RE),
            driver=d.str_("driver"),
            node_type=d.str_("node_type"),
            link_layer=d.str_("link_layer"),
            rate=d.str_("rate"),
        )
        for d in f.items("other_rdma")
    )
    itype = InstanceType(
        name=name,
        family=f.str_("family"),
        efa=_parse_efa(efa_f) if efa_f is not None else None,
        other_rdma=other,
        gpus=gpus,
        neuron=_parse_neuron(neuron_f, defaults) if neuron_f is not None else None,
    )
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
    return dataclasses.replace(t, efa=dataclasses.replace(t.efa, devices=devices),
                               neuron=dataclasses.replace(t.neuron, efa_mapping_library=True))


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


def load(path: Path | None = None) -> dict[str, InstanceType]:
    """Parse a catalog file (the packaged ``instances.yaml`` by default) into ``{name: InstanceType}``."""
    if path is None:
        text, source = _packaged_text(), "instances.yaml"
    else:
        text, source = path.read_text(encoding="utf-8"), str(path)
    top = _Fields(_yaml(text, source), source)
    defaults = top.sub("defaults") or _Fields({}, f"{source}.defaults")
    types = top.sub("types")
    if types is None:
        raise CatalogError(f"{source}: missing 'types'")
    return {
        str(name): _parse_type(str(name), _Fields(body, f"{source}: {name}"), defaults)
        for name, body in types.data.items()
    }


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
        raise UnknownInstanceType(instance_type, tuple(blocks))
    top = _Fields(_yaml(head, "instances.yaml") or {}, "instances.yaml")
    defaults = top.sub("defaults") or _Fields({}, "instances.yaml.defaults")
    body = _Fields(_yaml("types:\n" + block, "instances.yaml"), "instances.yaml").sub("types")
    if body is None or list(body.data) != [instance_type]:
        raise CatalogError(f"instances.yaml: the block of {instance_type} does not parse on its own")
    return _parse_type(instance_type, _Fields(body.data[instance_type], f"instances.yaml: {instance_type}"),
                       defaults)


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
