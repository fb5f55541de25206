"""Slice shapes for :mod:`bench_fleet_sim`: the ResourceSlices our drivers publish for a node, and variants of them.

The devices come from the drivers' own code (the profile's ``scan`` of a fake host tree of the instance type, then
:func:`accel_core.dra.publisher.build_slices`), i.e. what ``neuron-dra-driver slices`` / ``efa-dra-driver slices``
print. A *shape* rewrites each device of those slices: ``ours`` leaves them alone, ``minimal`` keeps only the
attributes the workloads' selectors and constraints read, and the ``no-*`` shapes drop one part of ours each.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from accel_core.dra.devices import CounterSet, SliceDevice
from accel_core.dra.profile import DraProfile
from accel_core.dra.publisher import build_slices
from accel_core.dra.service import dra_driver_version
from accel_core.fakehost import build_host
from accel_core.paths import HostPaths
from efa_plugin.dra.profile import EfaProfile
from neuron_dra.dra.profile import NeuronProfile

#: What the workloads (the seed claim templates) select or constrain on.
NEEDED = frozenset({"instanceType", "resource.aws.com/devicegroup4_id", "resource.kubernetes.io/pcieRoot"})
GROUP_IDS = tuple(f"resource.aws.com/devicegroup{n}_id" for n in (1, 8, 16))
TOPOLOGY = ("topology4_id", "topology8_id", "topology_x", "topology_y")
PCI = ("resource.kubernetes.io/pciBusID", "pciAddress")
DESCRIPTIVE = ("deviceId", "deviceName", "numaNode", "resourceType", "neuronDriverVersion", "firmwareVersion",
               "linkLayer", "portState", "rdmaDevice", "uverbs")

Device = dict[str, Any]


@dataclass(frozen=True)
class NodeDevices:
    """One driver's devices (and shared counters) on a node of one instance type."""

    driver: str
    devices: tuple[SliceDevice, ...]
    counters: tuple[CounterSet, ...]

    def slices(self, node: str) -> list[dict[str, Any]]:
        return [s.to_dict() for s in build_slices(self.driver, node, self.devices, counters=self.counters)]


def scan_devices(instance_type: str, *, efa: bool) -> list[NodeDevices]:
    """Our drivers' devices for a node of ``instance_type`` (Neuron if it has any, EFA when ``efa``)."""
    with tempfile.TemporaryDirectory(prefix="fleet-host-") as tmp:
        host = build_host(Path(tmp) / "host", instance_type, efa=efa)
        paths = HostPaths(host_root=host.root)
        profiles: list[DraProfile[Any, Any]] = [NeuronProfile()]
        if efa:
            profiles.append(EfaProfile())
        out = []
        for profile in profiles:
            scan = profile.scan(paths, dra_driver_version())
            if scan.devices:
                out.append(NodeDevices(profile.driver_name, tuple(scan.devices), tuple(scan.counters)))
        return out


def _drop_attrs(*names: str) -> Callable[[Device], None]:
    def edit(dev: Device) -> None:
        for name in names:
            dev.get("attributes", {}).pop(name, None)
    return edit


def _minimal(dev: Device) -> None:
    dev["attributes"] = {k: v for k, v in dev.get("attributes", {}).items() if k in NEEDED}
    dev.pop("capacity", None)


def _drop_capacity(dev: Device) -> None:
    dev.pop("capacity", None)


def _strings_only_needed(dev: Device) -> None:
    dev["attributes"] = {k: v for k, v in dev.get("attributes", {}).items() if "string" not in v or k in NEEDED}


SHAPES: dict[str, Callable[[Device], None] | None] = {
    "ours": None,
    "minimal": _minimal,
    "no-draDriverVersion": _drop_attrs("draDriverVersion"),
    "no-capacity": _drop_capacity,
    "no-group-1-8-16": _drop_attrs(*GROUP_IDS),
    "no-topology": _drop_attrs(*TOPOLOGY),
    "no-pci": _drop_attrs(*PCI),
    "no-descriptive": _drop_attrs(*DESCRIPTIVE),
    "no-other-strings": _strings_only_needed,
}


def reshape(slices: list[dict[str, Any]], shape: str) -> list[dict[str, Any]]:
    """Apply ``shape`` to every device of ``slices`` (in place) and return them."""
    edit = SHAPES[shape]
    if edit is not None:
        for s in slices:
            for dev in s["spec"].get("devices") or []:
                edit(dev)
    return slices
