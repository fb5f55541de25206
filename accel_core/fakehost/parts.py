"""What an accelerator adds to a fake host: a :class:`HostPart` (named by its registry declaration) writes its
devices' files and offers the mutations its tests use; :class:`Writer` writes files and links under the root.

The builder and :class:`~accel_core.fakehost.host.FakeHost` know no accelerator: they run every registered part,
and ``host.set_port_state(...)`` is the EFA part's method, found by name.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from accel_core.awsfacts.catalog import InstanceType, PciFunction
from accel_core.fakehost import layout
from accel_core.fakehost.fsops import FakeHostError, link, write_plain

if TYPE_CHECKING:
    from accel_core.fakehost.host import FakeHost

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


class HostPart:
    """One accelerator's share of a host tree. Subclasses set ``options`` (build options and their defaults,
    recorded in the tree's marker), and implement :meth:`check` and :meth:`write`; their public methods are the
    host's mutations (``self.host`` gives the generic ones: ``remove``, ``restore``, ``replace``)."""

    options: ClassVar[Mapping[str, Any]] = {}

    def __init__(self, host: FakeHost, spec: InstanceType, options: Mapping[str, Any]) -> None:
        self.host = host
        self.spec = spec
        self.opts = {**self.options, **{k: v for k, v in options.items() if k in self.options}}

    @classmethod
    def check(cls, spec: InstanceType, options: Mapping[str, Any]) -> None:
        """Refuse options this type cannot take (:class:`FakeHostError`), before anything is written."""

    def write(self, w: Writer) -> None:
        """Write this accelerator's files of ``self.spec``."""

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
