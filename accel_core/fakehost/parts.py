"""What an accelerator adds to a fake host: a :class:`HostPart` (named by its registry declaration) writes its
devices' files, offers the mutations its tests use, and brings its build options as command-line flags
(:class:`CliOption`), its fault verbs and its columns of ``fake-sysfs --list``; :class:`Writer` writes files and
links under the root.

The builder, :class:`~accel_core.fakehost.host.FakeHost` and the CLIs know no accelerator: they run every
registered part (:func:`part_types`), and ``host.set_port_state(...)`` is the EFA part's method, found by name.
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any, ClassVar, Protocol

from accel_core.awsfacts.catalog import InstanceType, PciFunction
from accel_core.fakehost import layout
from accel_core.fakehost.fsops import FakeHostError, link, write_plain
from accel_core.registry import accelerators, load_ref

#: the vendor of the PCI bridges the builder places between a root and the devices behind it (Amazon)
BRIDGE_VENDOR = "0x1d0f"


class Writer:
    """Writes files and relative links under one root while the tree is being built."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def file(self, rel: str, text: str) -> None:
        write_plain(self.root / rel, text)

    def files(self, rel_dir: str, values: Mapping[str, str]) -> None:
        for name, text in values.items():
            self.file(f"{rel_dir}/{name}", text)

    def link(self, rel: str, target_rel: str) -> None:
        link(self.root / rel, self.root / target_rel)

    def pci_function(self, fn: PciFunction, *, vendor: str, device: str, pci_class: str, driver: str) -> str:
        """The PCI function dir with its identity files, driver link and ``/sys/bus/pci`` links."""
        rel = layout.pci_dir(fn)
        if fn.bus != fn.root_bus:
            bridge = f"sys/devices/{fn.root}/{layout.bridge_bdf(fn)}"
            if not (self.root / bridge).exists():
                self.files(bridge, {"class": "0x060400\n", "vendor": f"{BRIDGE_VENDOR}\n",
                                    "numa_node": f"{fn.numa_node}\n"})
        self.files(rel, {"vendor": f"{vendor}\n", "device": f"{device}\n", "subsystem_vendor": f"{vendor}\n",
                         "subsystem_device": f"{device}\n", "class": f"{pci_class}\n",
                         "numa_node": f"{fn.numa_node}\n"})
        driver_dir = f"sys/bus/pci/drivers/{driver}"
        self.link(f"{rel}/driver", driver_dir)
        self.link(f"{driver_dir}/{fn.bdf}", rel)
        self.link(f"sys/bus/pci/devices/{fn.bdf}", rel)
        return rel


class Host(Protocol):
    """What a part uses of its :class:`~accel_core.fakehost.host.FakeHost`: the root and the generic mutations."""

    @property
    def root(self) -> Path: ...

    def remove(self, key: str, rels: list[str]) -> None: ...

    def restore(self, key: str) -> None: ...

    def replace(self, rel: str, text: str, what: str | None = None) -> None: ...


@dataclass(frozen=True)
class CliOption:
    """A build option as a command-line flag of ``fake-sysfs`` (and of ``accel-cluster up`` when cluster-wide):
    ``argparse`` keywords, with the option's name as ``dest``, so the parsed value is the option's value."""

    flag: str
    option: str
    kwargs: Mapping[str, Any] = field(default_factory=dict)
    cluster_wide: bool = True
    """False for a flag that names one node's identity (an UltraServer node number): a rig takes it per node."""

    def add_to(self, parser: argparse.ArgumentParser | argparse._ArgumentGroup, **override: Any) -> None:
        parser.add_argument(self.flag, dest=self.option, **{**self.kwargs, **override})


class HostPart:
    """One accelerator's share of a host tree. Subclasses set ``options`` (build options and their defaults,
    recorded in the tree's marker), and implement :meth:`check` and :meth:`write`; their public methods are the
    host's mutations (``self.host`` gives the generic ones: ``remove``, ``restore``, ``replace``)."""

    options: ClassVar[Mapping[str, Any]] = {}
    cli_options: ClassVar[tuple[CliOption, ...]] = ()
    """The build options a user can set from the command line, in the order they are passed on."""
    example: ClassVar[str] = ""
    """A device name as users see it, with its kind, for help texts: ``rdmap79s0 (EFA)``."""
    columns: ClassVar[tuple[str, ...]] = ()
    """Its columns in ``fake-sysfs --list`` (:meth:`row` gives a type's cells)."""

    def __init__(self, host: Host, spec: InstanceType, options: Mapping[str, Any]) -> None:
        self.host = host
        self.spec = spec
        self.opts = {**self.options, **{k: v for k, v in options.items() if k in self.options}}

    @classmethod
    def check(cls, spec: InstanceType, options: Mapping[str, Any]) -> None:
        """Refuse options this type cannot take (:class:`FakeHostError`), before anything is written."""

    @classmethod
    def applies(cls, spec: InstanceType, option: str) -> bool:
        """Whether a cluster-wide ``option`` applies to a host of ``spec`` (``lnc`` only to types with LNC)."""
        return True

    @classmethod
    def row(cls, spec: InstanceType) -> tuple[str, ...]:
        """Its cells of ``spec``'s row in ``fake-sysfs --list``, one per :attr:`columns`."""
        return ()

    @classmethod
    def add_verbs(cls, sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
        """Add its ``fake-sysfs`` fault verbs: each sets ``run(host, args) -> str``, the line the verb prints
        (:mod:`accel_core.fakehost.verbs` has the helpers: ``dir_and_device``, ``present``)."""

    def write(self, w: Writer) -> None:
        """Write this accelerator's files of ``self.spec``."""

    def summary(self) -> list[str]:
        """What it wrote, for the ``fake-sysfs`` line after a build (``16 EFA``...)."""
        return []

    # -- devices by the names users see (the ``fake-sysfs remove``/``restore``/``show`` verbs); none by default

    def device_names(self) -> list[str]:
        """This part's devices as built (removals do not change the list), e.g. ``rdmap79s0`` or ``neuron3``."""
        return []

    def device_kind(self, name: str) -> str:
        """What users call the named device (``EFA``, ``RDMA``, ``Neuron``), in listings and errors."""
        return "device"

    def removal_key(self, name: str) -> str:
        """The :meth:`FakeHost.remove` key under which :meth:`remove_device` records ``name``."""
        raise self.fail(f"{name!r} cannot be removed")

    def remove_device(self, name: str) -> None:
        """Remove the named device as its driver losing it would (sysfs entries, PCI function, ``/dev`` node)."""
        raise self.fail(f"{name!r} cannot be removed")

    def restore_device(self, name: str) -> None:
        """Put back what :meth:`remove_device` removed."""
        raise self.fail(f"{name!r} cannot be restored")

    def dev_node(self, name: str) -> str:
        """The named device's ``/dev`` path."""
        raise self.fail(f"{name!r} has no device node")

    def device_state(self, name: str) -> str:
        """One line on the named device's state as its health rule sees it (``port 1 ACTIVE``...)."""
        return ""

    def fail(self, message: str) -> FakeHostError:
        return FakeHostError(f"{self.spec.name}: {message}")


@cache
def part_types() -> tuple[type[HostPart], ...]:
    """The registered accelerators' fake-host parts, in registry order."""
    out = []
    for acc in accelerators():
        if acc.fakehost is not None:
            part = load_ref(acc.fakehost)
            if not (isinstance(part, type) and issubclass(part, HostPart)):
                raise FakeHostError(f"accelerator {acc.name}: fakehost {acc.fakehost} is not a HostPart")
            out.append(part)
    return tuple(out)


def cli_options(*, cluster_wide_only: bool = False) -> tuple[tuple[type[HostPart], CliOption], ...]:
    """Every registered part's command-line options with their part (only the cluster-wide ones if asked)."""
    return tuple((part, opt) for part in part_types() for opt in part.cli_options
                 if opt.cluster_wide or not cluster_wide_only)
