"""Slice shapes for :mod:`bench_fleet_sim`: the ResourceSlices our drivers publish for a node, and variants of them.

The devices come from the drivers' own code (the profile's ``scan`` of a fake host tree of the instance type, then
:func:`accel_core.dra.publisher.build_slices`), i.e. what ``neuron-dra-driver slices`` / ``efa-dra-driver slices``
print. A *shape* rewrites each device of those slices: ``ours`` leaves them alone, ``minimal`` keeps only the
attributes the workload's selectors and constraints read (:func:`needed_attributes`), the ``no-*`` shapes drop one
part of ours each, and
``int-cores-memory`` / ``old-capacity`` add a Neuron device's core count and memory (catalog facts) back to ours,
as int attributes or as the device capacity published before 0.1.0's change; ``before-aws-parity`` is ours without
``resource.kubernetes.io/numaNode`` and ``aws-labels`` ours with the four Node-label attributes (a node labelled
with EC2 topology and a Capacity Block).
"""

from __future__ import annotations

import re
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from accel_core.awsfacts import catalog
from accel_core.dra.daemon import dra_driver_version
from accel_core.dra.nodelabels import with_attributes
from accel_core.dra.profile import DraProfile
from accel_core.dra.publisher import build_slices
from accel_core.dra.slicemodel import CounterSet, SliceDevice
from accel_core.fakehost import build_host
from accel_core.paths import HostPaths
from efa_plugin.dra.profile import EfaProfile
from neuron_dra.dra.profile import NeuronProfile
from neuron_dra.facts import ultraserver

#: Our drivers' attribute domains: an attribute named in one of them is published without the domain.
DRIVER_DOMAINS = ("neuron.aws.com", "efa.aws.com")
_CEL_ATTRIBUTE = re.compile(r"""device\.attributes\[['"]([^'"]+)['"]\]\.([A-Za-z0-9_]+)""")
_MATCH_ATTRIBUTE = re.compile(r"""matchAttribute:\s*['"]?([A-Za-z0-9_./-]+)""")
GROUP_IDS = tuple(f"resource.aws.com/devicegroup{n}_id" for n in (1, 8, 16))
TOPOLOGY = ("topology4_id", "topology8_id", "topology_x", "topology_y")
PCI = ("resource.kubernetes.io/pciBusID", "pciAddress")
DESCRIPTIVE = ("deviceId", "deviceName", "numaNode", "resourceType", "neuronDriverVersion", "firmwareVersion",
               "linkLayer", "portState", "rdmaDevice", "uverbs")

Device = dict[str, Any]


def needed_attributes(template_text: str) -> frozenset[str]:
    """The attribute names (as our slices key them) that a claim template's CEL selectors and ``matchAttribute``
    constraints read: ``device.attributes['neuron.aws.com'].instanceType`` -> ``instanceType``,
    ``matchAttribute: resource.aws.com/devicegroup4_id`` -> that qualified name."""
    names = {name if domain in DRIVER_DOMAINS else f"{domain}/{name}"
             for domain, name in _CEL_ATTRIBUTE.findall(template_text)}
    for qualified in _MATCH_ATTRIBUTE.findall(template_text):
        domain, _, name = qualified.rpartition("/")
        names.add(name if domain in DRIVER_DOMAINS else qualified)
    return frozenset(names)


@dataclass(frozen=True)
class NodeDevices:
    """One driver's devices (and shared counters) on a node of one instance type."""

    driver: str
    devices: tuple[SliceDevice, ...]
    counters: tuple[CounterSet, ...]

    def slices(self, node: str) -> list[dict[str, Any]]:
        return [s.to_dict() for s in build_slices(self.driver, node, self.devices, counters=self.counters)]


def scan_devices(instance_type: str, *, efa: bool, core_devices: str = "off") -> list[NodeDevices]:
    """Our drivers' devices for a node of ``instance_type`` (Neuron if it has any, EFA when ``efa``; Neuron core
    devices as ``--core-devices`` says)."""
    return scan_devices_and_labels(instance_type, efa=efa, core_devices=core_devices)[0]


def scan_devices_and_labels(instance_type: str, *, efa: bool, core_devices: str = "off", **host_options: Any
                            ) -> tuple[list[NodeDevices], dict[str, str]]:
    """:func:`scan_devices` of a fake host built with ``host_options``, and the node labels the drivers set."""
    with tempfile.TemporaryDirectory(prefix="fleet-host-") as tmp:
        host = build_host(Path(tmp) / "host", instance_type, efa=efa, **host_options)
        paths = HostPaths(host_root=host.root)
        profiles: list[DraProfile[Any, Any]] = [NeuronProfile(core_devices=core_devices)]
        if efa:
            profiles.append(EfaProfile())
        out, labels = [], {}
        for profile in profiles:
            scan = profile.scan(paths, dra_driver_version())
            labels.update({k: v for k, v in scan.node_labels.items() if v is not None})
            devices = with_attributes(scan.devices, {})  # as serve publishes them on a Node without labels
            if devices:
                out.append(NodeDevices(profile.driver_name, tuple(devices), tuple(scan.counters)))
        return out, labels


Edit = Callable[[Device, frozenset[str]], None]
"""A shape's change to one device, given the attributes the workload reads."""


def _drop_attrs(*names: str) -> Edit:
    def edit(dev: Device, needed: frozenset[str]) -> None:
        for name in names:
            dev.get("attributes", {}).pop(name, None)
    return edit


def _minimal(dev: Device, needed: frozenset[str]) -> None:
    dev["attributes"] = {k: v for k, v in dev.get("attributes", {}).items() if k in needed}
    dev.pop("capacity", None)


def _neuron_spec(dev: Device) -> catalog.NeuronSpec | None:
    """The catalog's Neuron facts for a Neuron chip device (None for EFA and UltraServer node devices)."""
    attrs = dev.get("attributes", {})
    if attrs.get("resourceType", {}).get("string") != "neuron_device":
        return None
    return catalog.get(attrs["instanceType"]["string"]).neuron


def _int_cores_memory(dev: Device, needed: frozenset[str]) -> None:
    spec = _neuron_spec(dev)
    if spec is not None:
        dev["attributes"]["cores"] = {"int": spec.cores_per_device}
        dev["attributes"]["memory"] = {"int": spec.memory_bytes}


def _old_capacity(dev: Device, needed: frozenset[str]) -> None:
    spec = _neuron_spec(dev)
    if spec is not None:
        dev["capacity"] = {"cores": {"value": str(spec.cores_per_device)},
                           "memory": {"value": str(spec.memory_bytes)}}


#: The attributes and capacity of a device in upstream's scheduler_perf DRA ResourceSlice template
#: (k8s.io/kubernetes v1.37.2 test/integration/scheduler_perf/dra/templates/resourceslice-basic-devices.yaml, "a
#: decent, realistic number of attributes", modelled on a GPU); per-device values (PCI addresses) are made up here.
UPSTREAM_BASIC_ATTRIBUTES: dict[str, dict[str, Any]] = {
    "driver": {"string": "xe"}, "driverVersion": {"version": "1.2.3"},
    "resource.k8s.io/pciRoot": {"string": "0"}, "family": {"string": "Arc Pro B-Series"},
    "health": {"string": "Healthy"}, "model": {"string": "B60"}, "pciAddress": {"string": "0000:00:00.0"},
    "pciId": {"string": "0xe211"}, "pciRoot": {"string": "00"},
    "resource.kubernetes.io/pciBusID": {"string": "0000:00:00.0"},
    "resource.kubernetes.io/pciRoot": {"string": "pci0000:00"}, "sriov": {"bool": True}, "type": {"string": "gpu"},
}
UPSTREAM_BASIC_CAPACITY = {"memory": {"value": "24480Mi"}, "millicores": {"value": "1k"}}


def _upstream_basic(dev: Device, needed: frozenset[str]) -> None:
    """Upstream's scheduler_perf device (13 attributes, 2 capacities) plus what the workload reads."""
    kept = {k: v for k, v in dev.get("attributes", {}).items() if k in needed}
    dev["attributes"] = {**{k: dict(v) for k, v in UPSTREAM_BASIC_ATTRIBUTES.items()}, **kept}
    dev["capacity"] = {k: dict(v) for k, v in UPSTREAM_BASIC_CAPACITY.items()}


def _strings_only_needed(dev: Device, needed: frozenset[str]) -> None:
    dev["attributes"] = {k: v for k, v in dev.get("attributes", {}).items() if "string" not in v or k in needed}


#: The attributes AWS's driver takes from the Node's topology labels, with values shaped as EC2 gives them
#: (network node ids ``nn-`` and a Capacity Block reservation ``cr-`` plus 17 hex digits).
AWS_LABEL_ATTRIBUTES = {"networkNodeLayer1": "nn-0a1b2c3d4e5f60718", "networkNodeLayer2": "nn-1a1b2c3d4e5f60718",
                        "networkNodeLayer3": "nn-2a1b2c3d4e5f60718", "capacityBlockId": "cr-0a1b2c3d4e5f60718"}


def _aws_labels(dev: Device, needed: frozenset[str]) -> None:
    """Ours with the Node-label attributes a labelled node's devices carry (:mod:`accel_core.dra.nodelabels`)."""
    dev.setdefault("attributes", {}).update({k: {"string": v} for k, v in AWS_LABEL_ATTRIBUTES.items()})


SHAPES: dict[str, Edit | None] = {
    "ours": None,
    "minimal": _minimal,
    "upstream-basic": _upstream_basic,
    "no-draDriverVersion": _drop_attrs("draDriverVersion"),
    "int-cores-memory": _int_cores_memory,
    "old-capacity": _old_capacity,
    "no-group-1-8-16": _drop_attrs(*GROUP_IDS),
    "no-topology": _drop_attrs(*TOPOLOGY),
    "no-pci": _drop_attrs(*PCI),
    "no-descriptive": _drop_attrs(*DESCRIPTIVE),
    "no-other-strings": _strings_only_needed,
    "before-aws-parity": _drop_attrs("resource.kubernetes.io/numaNode"),
    "aws-labels": _aws_labels,
}


def reshape(slices: list[dict[str, Any]], shape: str, needed: frozenset[str]) -> list[dict[str, Any]]:
    """Apply ``shape`` to every device of ``slices`` (in place) and return them; ``needed``: the attributes the
    workload reads (:func:`needed_attributes`)."""
    edit = SHAPES[shape]
    if edit is not None:
        for s in slices:
            for dev in s["spec"].get("devices") or []:
                edit(dev, needed)
    return slices


class Fleet:
    """The devices and UltraServer labels of node ``index`` of a fleet of one instance type. Every node of a plain
    type has the same devices (scanned once); see :class:`UltraServerFleet`."""

    def __init__(self, instance_type: str, *, efa: bool, core_devices: str = "off") -> None:
        self._kinds = scan_devices(instance_type, efa=efa, core_devices=core_devices)

    @staticmethod
    def of(instance_type: str, *, efa: bool, core_devices: str = "off") -> Fleet:
        """The fleet of ``instance_type``: in UltraServers where the catalog says its nodes form them."""
        neuron = catalog.get(instance_type).neuron
        cls = UltraServerFleet if neuron is not None and neuron.ultraserver else Fleet
        return cls(instance_type, efa=efa, core_devices=core_devices)

    @property
    def drivers(self) -> list[str]:
        return [k.driver for k in self.kinds(0)]

    def kinds(self, index: int) -> list[NodeDevices]:
        return self._kinds

    def labels(self, index: int) -> dict[str, str]:
        return {}

    def slices(self, node: str, index: int) -> list[dict[str, Any]]:
        return [obj for kind in self.kinds(index) for obj in kind.slices(node)]


class UltraServerFleet(Fleet):
    """Nodes of 4-node UltraServers: node ``index`` is node ``index % 4`` of UltraServer ``us-<index // 4>``.

    Each of the four node positions is scanned once, from a fake host of UltraServer ``us-template``; for another
    UltraServer the template's server ids are replaced, in the slices and the node labels the driver would publish,
    by that UltraServer's (:func:`neuron_dra.facts.ultraserver.fake_ids`, what its fake host would hold):
    scanning a host per node would take seconds each."""

    TEMPLATE = "us-template"

    def __init__(self, instance_type: str, *, efa: bool, core_devices: str = "off") -> None:
        self._positions = [scan_devices_and_labels(instance_type, efa=efa, core_devices=core_devices,
                                                   ultraserver_id=self.TEMPLATE, ultraserver_node=node)
                           for node in range(ultraserver.NODES_PER_ULTRASERVER)]

    def _ids(self, index: int) -> dict[str, str]:
        """Template server id -> this node's UltraServer's, for node ``index``."""
        node = index % ultraserver.NODES_PER_ULTRASERVER
        old, new = ultraserver.fake_ids(self.TEMPLATE, node), ultraserver.fake_ids(f"us-{index // 4}", node)
        return {old.server_id_2: new.server_id_2, old.server_id_4: new.server_id_4}

    def kinds(self, index: int) -> list[NodeDevices]:
        return self._positions[index % ultraserver.NODES_PER_ULTRASERVER][0]

    def labels(self, index: int) -> dict[str, str]:
        ids = self._ids(index)
        return {k: ids.get(v, v) for k, v in self._positions[index % ultraserver.NODES_PER_ULTRASERVER][1].items()}

    def slices(self, node: str, index: int) -> list[dict[str, Any]]:
        return replace_strings(super().slices(node, index), self._ids(index))


def replace_strings(obj: Any, mapping: dict[str, str]) -> Any:
    """A copy of the JSON-like ``obj`` with every string value that is a key of ``mapping`` replaced by its value
    (dict keys are left alone)."""
    if isinstance(obj, dict):
        return {k: replace_strings(v, mapping) for k, v in obj.items()}
    if isinstance(obj, list):
        return [replace_strings(v, mapping) for v in obj]
    if isinstance(obj, str):
        return mapping.get(obj, obj)
    return obj
