"""The instance catalog: per EC2 instance type, the hardware each registered accelerator describes.

The catalog names no accelerator. Each declaration (:mod:`accel_core.registry`) brings its sections (a key and the
msgspec Struct that decodes it) and a catalog file holding those sections for the types it knows; this module
merges the files by type: ``get("trn2.48xlarge").section("neuron")`` comes from Neuron's file, ``section("efa")``
from EFA's. ``instances.yaml`` beside this module holds the types no accelerator describes.

A section Struct may define ``resolve(ctx: SectionContext)`` (its resolved value is what ``section`` returns), and
a resolved value may define ``pci_addresses()`` (the catalog refuses one PCI address twice in a type) and
``check(itype)`` (a cross-section check; its ValueError becomes a :class:`CatalogError` naming the type). A
malformed file raises :class:`CatalogError` naming the file, the type and the field.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Annotated, Any

import msgspec
import yaml

from accel_core.registry import accelerators, load_ref


class CatalogError(ValueError):
    """A catalog file is malformed; the message names the file, the instance type and the field."""


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
class SectionContext:
    """What a section's ``resolve`` may use besides its own fields: the type's name and its file's defaults."""

    instance_type: str
    defaults: Mapping[str, Any]


@dataclass(frozen=True)
class InstanceType:
    """One EC2 instance type: its family and each accelerator's section (decoded, resolved), by section key.

    ``itype.section("efa")`` or, shorter, ``itype.efa``: None when the type has no such section."""

    name: str
    family: str
    sections: Mapping[str, Any] = field(default_factory=dict)

    def section(self, key: str) -> Any:
        """An accelerator's section (None when the type has none)."""
        return self.sections.get(key)

    def __getattr__(self, key: str) -> Any:
        """A registered section by its key (None when this type has none); AttributeError for any other name."""
        if not key.startswith("_") and key in _section_types():
            return self.sections.get(key)
        raise AttributeError(f"{type(self).__name__} has no attribute {key!r} (nor is it a catalog section; "
                             f"known: {', '.join(sorted(_section_types()))})")


# --------------------------------------------------------------------------------------------- field types

Bdf = Annotated[str, msgspec.Meta(pattern=r"^[0-9a-f]{4}:[0-9a-f]{2}:[0-1][0-9a-f]\.[0-7]$")]
Root = Annotated[str, msgspec.Meta(pattern=r"^pci[0-9a-f]{4}:[0-9a-f]{2}$")]
Hex = Annotated[str, msgspec.Meta(pattern=r"^0x[0-9a-f]{4}$")]


class PciFields(msgspec.Struct, forbid_unknown_fields=True):
    """The PCI fields every device entry of a section carries (``bdf``, ``root``, ``numa``)."""

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


def check_indices(indices: list[int]) -> None:
    """Device indices must be ``0..n-1`` in order (ValueError otherwise)."""
    if indices != list(range(len(indices))):
        raise ValueError(f"device indices must be 0..{len(indices) - 1} in order, got {indices}")


# --------------------------------------------------------------------------------------------- decoding


class _TypeHead(msgspec.Struct):
    """The one field of a type no accelerator owns; every other key is a section an accelerator registers."""

    family: str


_HEAD_FIELDS = frozenset(_TypeHead.__struct_fields__)


@cache
def _section_types() -> dict[str, Any]:
    """Section key -> its Struct, from the registered accelerators (:mod:`accel_core.registry`)."""
    return {key: load_ref(ref) for acc in accelerators() for key, ref in acc.catalog_sections.items()}


def _decode(kind: Any, raw: Any, where: str, key: str = "") -> Any:
    """``raw`` as ``kind``; a CatalogError such as ``instances.yaml: z1.big: Expected `str` matching regex ... -
    at `neuron.devices[0].bdf``` otherwise."""
    try:
        return msgspec.convert(raw, kind)
    except msgspec.ValidationError as exc:
        raise CatalogError(f"{where}: {str(exc).replace('`$', f'`{key}' if key else '`')}") from None


def _resolve(section: Any, ctx: SectionContext) -> Any:
    if isinstance(section, tuple):
        return tuple(_resolve(item, ctx) for item in section)
    resolve = getattr(section, "resolve", None)
    return resolve(ctx) if resolve is not None else section


def _each(section: Any) -> Iterator[Any]:
    """The section, or each item of a list section."""
    yield from section if isinstance(section, tuple) else (section,)


@dataclass(frozen=True)
class _Part:
    """One file's entry for a type: its family and its sections (resolved)."""

    family: str
    sections: dict[str, Any]


def _parse_type(name: str, raw: Any, defaults: Mapping[str, Any], source: str) -> _Part:
    where = f"{source}: {name}"
    if not isinstance(raw, dict):
        raise CatalogError(f"{where}: expected a mapping, got {type(raw).__name__}")
    head = _decode(_TypeHead, {k: v for k, v in raw.items() if k in _HEAD_FIELDS}, where)
    kinds, ctx = _section_types(), SectionContext(name, defaults)
    sections: dict[str, Any] = {}
    for key, body in raw.items():
        if key in _HEAD_FIELDS or body is None:
            continue
        kind = kinds.get(key)
        if kind is None:
            raise CatalogError(f"{where}: unknown section {key!r} (no registered accelerator declares it; "
                               f"known: {', '.join(sorted(kinds))})")
        try:
            sections[key] = _resolve(_decode(kind, body, where, key), ctx)
        except (KeyError, ValueError) as exc:
            if isinstance(exc, CatalogError):
                raise
            raise CatalogError(f"{where}: {key}: {exc}") from None
    return _Part(head.family, sections)


def _merge(name: str, parts: list[tuple[str, _Part]]) -> InstanceType:
    """One type from every file's entry for it: one family, each section from one file, then the checks."""
    families = {part.family for _source, part in parts}
    if len(families) > 1:
        raise CatalogError(f"instance type {name}: the files disagree on its family "
                           f"({'; '.join(f'{source}: {part.family}' for source, part in parts)})")
    sections: dict[str, Any] = {}
    for source, part in parts:
        for key, value in part.sections.items():
            if key in sections:
                raise CatalogError(f"{source}: {name}: section {key!r} is given by another catalog file too")
            sections[key] = value
    itype = InstanceType(name=name, family=parts[0][1].family, sections=sections)
    _check(itype)
    return itype


def _check(itype: InstanceType) -> None:
    bdfs = [bdf for section in itype.sections.values() for item in _each(section)
            for bdf in (item.pci_addresses() if hasattr(item, "pci_addresses") else ())]
    dupes = sorted({b for b in bdfs if bdfs.count(b) > 1})
    if dupes:
        raise CatalogError(f"instance type {itype.name}: duplicate PCI address {dupes}")
    for item in (item for section in itype.sections.values() for item in (section, *_each(section))):
        check = getattr(item, "check", None)  # a section's, or each item's of a list section
        if check is not None:
            try:
                check(itype)
            except ValueError as exc:
                raise CatalogError(f"instance type {itype.name}: {exc}") from None


# --------------------------------------------------------------------------------------------- files

#: libyaml's safe loader parses the catalog ~10x faster than the pure-Python one (daemon start-up)
_SAFE_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


@dataclass(frozen=True)
class _File:
    """A catalog file, composed (libyaml) but not constructed: a daemon builds the one type it asks for."""

    source: str
    defaults: dict[str, Any]
    types: dict[str, yaml.Node]


def _construct(node: yaml.Node | None) -> Any:
    return _SAFE_LOADER("").construct_document(node)


def _compose(text: str, source: str) -> _File:
    try:
        root = yaml.compose(text, Loader=_SAFE_LOADER)
    except yaml.YAMLError as exc:
        raise CatalogError(f"{source}: not valid YAML: {' '.join(str(exc).split())}") from None
    if not isinstance(root, yaml.MappingNode):
        raise CatalogError(f"{source}: expected a mapping, got {type(_construct(root)).__name__}")
    top = {str(key.value): value for key, value in root.value}
    defaults = _construct(top["defaults"]) if "defaults" in top else {}
    if not isinstance(defaults or {}, dict):
        raise CatalogError(f"{source}: defaults: expected a mapping")
    types = top.get("types")
    if not isinstance(types, yaml.MappingNode):
        raise CatalogError(f"{source}: missing 'types'")
    return _File(source, defaults or {}, {str(key.value): value for key, value in types.value})


@cache
def _registered() -> tuple[_File, ...]:
    """Each registered accelerator's catalog file, then the catalog's own file."""
    out = []
    for acc in accelerators():
        if acc.catalog_file is None:
            continue
        package, _, name = acc.catalog_file.partition(":")
        source = f"{acc.name} catalog {acc.catalog_file}"
        try:
            out.append(_compose(resources.files(package).joinpath(name).read_text(encoding="utf-8"), source))
        except (OSError, ModuleNotFoundError) as exc:
            raise CatalogError(f"{source}: cannot read it ({exc})") from None
    own = resources.files(__package__ or "").joinpath("instances.yaml").read_text(encoding="utf-8")
    return (*out, _compose(own, "instances.yaml"))


@cache
def _registered_defaults() -> dict[str, Any]:
    """Every registered file's ``defaults``: a file given to :func:`load` falls back to them."""
    return {key: value for file in _registered() for key, value in file.defaults.items()}


def _type(name: str, files: Iterable[_File]) -> InstanceType:
    parts = [(f.source, _parse_type(name, _construct(f.types[name]), {**_registered_defaults(), **f.defaults},
                                    f.source)) for f in files if name in f.types]
    return _merge(name, parts)


def _names(files: Iterable[_File]) -> tuple[str, ...]:
    return tuple(dict.fromkeys(name for f in files for name in f.types))


def load(*paths: Path) -> dict[str, InstanceType]:
    """``{name: InstanceType}`` merged from the catalog files ``paths`` (by default: every registered
    accelerator's catalog file and the catalog's own)."""
    files = tuple(_compose(path.read_text(encoding="utf-8"), str(path)) for path in paths) or _registered()
    return {name: _type(name, files) if paths else get(name) for name in _names(files)}


def names() -> tuple[str, ...]:
    """Instance types in catalog order: by first appearance in the accelerators' files, then the catalog's own."""
    return _names(_registered())


@cache
def get(instance_type: str) -> InstanceType:
    """The catalog entry for ``instance_type``; :class:`UnknownInstanceType` (a KeyError) if absent. Only that
    type's entries are built (a daemon asks for one)."""
    if instance_type not in names():
        raise UnknownInstanceType(instance_type, names())
    return _type(instance_type, _registered())
