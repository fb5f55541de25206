"""The Neuron DRA driver ``neuron.aws.com`` as a profile of the generic DRA core (:mod:`accel_core.dra`).

- devices: one per Neuron device (chip), ``neuron-device-<i>``, with the attributes of :mod:`.attributes`; on an
  UltraServer node also ``neuron-node`` (the node's share, excluding the chips by a shared counter) and the
  UltraServer node labels (:mod:`.ultraserver`);
- host side: the Neuron host scanner the device plugin uses too (:mod:`neuron_dra.scanner`): health under
  :mod:`neuron_dra.health_rule` (device or /dev node gone, uncorrected ECC errors) becomes a taint and the kubelet's
  health stream; the uncorrected-error counters are the health files the core polls between rescans; a vanished
  device keeps the PCI address, PCIe root and NUMA node it had, so its published identity stays put while it is
  gone (only its taint changes) and it comes back unchanged; the coexistence guard;
- config: ``NeuronConfig`` (:mod:`.config`), Logical NeuronCore per request; ``UltraServerConfig``, the
  UltraServer runtime env for a ``neuron-node`` request;
- container edits, from the builder the device plugin's Allocate uses (:mod:`neuron_dra.edits`): ``/dev/neuron<i>``
  per device; per request ``NEURON_RT_VISIBLE_CORES`` (all logical cores of the request's devices, numbered by
  ``--core-numbering`` as the device plugin numbers them: see neuron_dra.runtime_env) and
  ``NEURON_LOGICAL_NC_CONFIG`` when the claim sets it;
- nothing is published or prepared while the Neuron device plugin runs on the node;
- with ``core_devices="on"`` (``--core-devices``) each chip's logical NeuronCores are devices too, sharing the
  chip's per-core counters (:mod:`.cores`); a core device's container gets its chip's ``/dev/neuron<i>`` and only
  its cores. ``node-label``: the same, but the core devices are published only while the Node carries
  ``neuron.aws.com/core-devices=true`` (opt-in per node pool).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace

from accel_core.dra.profile import RequestEdits, Scan
from accel_core.dra.slicemodel import CounterSet, SliceDevice
from accel_core.dra.types import ClaimError, DeviceStatusData
from accel_core.edits import ContainerEdits
from accel_core.paths import HostPaths
from neuron_dra import DRA_DRIVER_NAME, coreids
from neuron_dra.discovery import NeuronDevice, NeuronInventory
from neuron_dra.dra import cores
from neuron_dra.dra import ultraserver as us_dra
from neuron_dra.dra.attributes import NODE_LABEL_ATTRIBUTES, device_index, device_name, slice_devices
from neuron_dra.dra.config import NeuronConfig, decode_parameters
from neuron_dra.edits import CoreNumbering, device_node, format_core_list, runtime_env
from neuron_dra.facts import ultraserver as us_facts
from neuron_dra.scanner import CoreDevicesScanner, NeuronScanner, logical_cores


class NeuronProfile:
    """:class:`~accel_core.dra.profile.DraProfile` for Neuron devices. On the Neuron host scanner."""

    driver_name: str = DRA_DRIVER_NAME
    metrics_prefix: str = "neuron_dra"
    default_config: NeuronConfig = NeuronConfig()

    def __init__(self, scanner: NeuronScanner | None = None, *, core_numbering: CoreNumbering = "container",
                 core_devices: str = "off") -> None:
        if core_devices not in cores.MODES:
            raise ValueError(f"core_devices: {core_devices!r} is not one of {', '.join(cores.MODES)}")
        self.core_devices = core_devices != "off"
        """Publish each chip's NeuronCores as devices too (:mod:`.cores`)."""
        self.core_gate = cores.GATE_ATTRIBUTE if core_devices == "node-label" else None
        """With ``node-label``: only while the Node carries ``neuron.aws.com/core-devices=true``."""
        self.label_attributes = ({**NODE_LABEL_ATTRIBUTES, cores.NODE_LABEL: cores.GATE_ATTRIBUTE}
                                 if self.core_gate else NODE_LABEL_ATTRIBUTES)
        if scanner is None:
            scanner = CoreDevicesScanner() if self.core_devices else NeuronScanner()
        self.scanner = scanner
        self.core_numbering: CoreNumbering = core_numbering

    def scan(self, paths: HostPaths, dra_version: str) -> Scan[NeuronInventory]:
        host = self.scanner.scan(paths)
        inv = host.inventory
        health = {device_name(d.index): host.health[str(d.index)] for d in inv.devices}
        summary = dict(host.summary)
        devices = slice_devices(inv, dra_version)
        counters: tuple[CounterSet, ...] = ()
        if self.core_devices and devices:
            parts, chip_sets = cores.partitioned(inv, devices, dra_version, gate=self.core_gate)
            devices, counters = parts, tuple(chip_sets)
            for dev in devices:  # a core is as healthy as its chip
                core = cores.parse_core_device(dev.name)
                if core is not None:
                    health[dev.name] = health[device_name(core[0])]
        ids = inv.ultraserver
        if ids is not None and devices:
            node_cores = sum(d.core_count for d in inv.devices if d.core_count > 0) if self.core_devices else 0
            devices = [replace(d, consumes={**d.consumes, **self._us_consumes(d, inv.lnc)}) for d in devices]
            devices.append(us_dra.node_device(ids, inv.instance_type, inv.driver_version, dra_version,
                                              len(inv.devices), node_cores))
            counters = (*counters, us_dra.chip_counters(len(inv.devices), node_cores))
            sick = next((h for h in health.values() if not h.healthy), None)
            if sick is not None:  # the node's share is only as good as its worst chip
                health[us_dra.NODE_DEVICE] = sick
            summary = {**summary, "ultraserver": ids.server_id_4, "ultraserver_node": ids.node_id_4}
        return Scan(inv, tuple(devices), health, host.problems, summary, counters=counters,
                    node_labels=us_facts.node_labels(ids), node_label_attributes=self.label_attributes)

    @staticmethod
    def _us_consumes(device: SliceDevice, lnc: int | None) -> dict[str, dict[str, int]]:
        """What a chip or core device consumes of the UltraServer node's ``neuron-chips`` set."""
        if cores.parse_core_device(device.name) is not None:
            return us_dra.core_consumes(lnc or 1)
        return us_dra.chip_consumes()

    def decode_config(self, parameters: object, where: str) -> NeuronConfig:
        return decode_parameters(parameters, where)

    def container_edits(self, inventory: NeuronInventory, request: str, devices: Sequence[str],
                        config: NeuronConfig) -> RequestEdits:
        """``/dev/neuron<i>`` per device (in index order; a core device gets its chip's) and the request's
        NeuronCore env: every logical core of its chips, and of its core devices only theirs."""
        by_index = {d.index: d for d in inventory.devices}
        whole_node = us_dra.NODE_DEVICE in devices
        if config.ultraserver_mode is not None and not whole_node:
            raise ClaimError(f"request {request}: an UltraServerConfig needs the node's {us_dra.NODE_RESOURCE_TYPE} "
                             f"device ({us_dra.NODE_DEVICE}), but the request got {', '.join(devices)}")
        if whole_node:
            if inventory.ultraserver is None:
                raise ClaimError(f"device {us_dra.NODE_DEVICE} (request {request}): this node is not part of an "
                                 "UltraServer")
            devices = [*(d for d in devices if d != us_dra.NODE_DEVICE),
                       *(device_name(d.index) for d in inventory.devices)]
        whole: set[int] = set()
        parts: dict[int, set[int]] = {}  # chip -> physical cores of its core devices in the request
        chip_of: dict[str, int] = {}
        for name in devices:
            core = cores.parse_core_device(name)
            index = core[0] if core is not None else device_index(name)
            if index is None or index not in by_index:
                raise ClaimError(f"device {name} (request {request}) is not a Neuron device of this node "
                                 f"(devices: {', '.join(device_name(i) for i in sorted(by_index)) or 'none'})")
            dev = by_index[index]
            if not dev.present:
                raise ClaimError(f"device {name} (request {request}) is not present on this node: "
                                 f"{'; '.join(dev.problems) or 'missing'}")
            if core is None:
                whole.add(index)
            else:
                count = logical_cores(dev, inventory.lnc)
                if core[1] >= count:
                    raise ClaimError(f"device {name} (request {request}) is not a NeuronCore of this node: "
                                     f"{device_name(index)} has {count} logical cores")
                parts.setdefault(index, set()).update(coreids.core_ids(core[1], inventory.lnc or 1))
            chip_of[name] = index
        lnc = config.logical_neuron_core
        if lnc is not None and not inventory.lnc_applies:
            kind = inventory.devices[0].device_name if inventory.devices else inventory.arch
            node = inventory.instance_type or "this node"
            raise ClaimError(f"request {request}: logicalNeuronCore: {lnc} is set, but {node} ({kind}) has no "
                             "Logical NeuronCore setting")
        effective = lnc if lnc is not None else (inventory.lnc if inventory.lnc_applies else None)
        width = effective or 1
        indices = sorted(whole | set(parts))
        per_device = 1
        local: dict[int, list[int]] = {}  # chip -> its logical cores (at ``effective``) the request may use
        for index in indices:
            per_device = coreids.logical_cores(by_index[index].core_count, effective)
            if index in whole:
                local[index] = list(range(per_device))
                continue
            physical = parts[index]
            local[index] = sorted({p // width for p in physical})
            if any(not set(range(c * width, (c + 1) * width)) <= physical for c in local[index]):
                names = ", ".join(n for n, i in chip_of.items() if i == index)
                raise ClaimError(f"request {request}: logicalNeuronCore: {effective} needs whole pairs of physical "
                                 f"cores, but {names} of {device_name(index)} is not (ask for 2 cores of one chip)")
        core_ids = [coreids.core_id(index, per_device, c) for index in indices for c in local[index]]
        env = list(runtime_env(core_ids, cores_per_device=per_device, lnc=lnc, numbering=self.core_numbering))
        if config.ultraserver_mode is not None:
            env.extend(us_dra.runtime_env(inventory.ultraserver, config.ultraserver_mode, request,
                                          inventory.instance_type or "this node"))
        edits = {name: ContainerEdits(device_nodes=(device_node(chip_of[name]),))
                 for name in sorted(chip_of, key=lambda n: (chip_of[n], n))}
        status = device_status([by_index[i] for i in indices if i in whole], effective, self.core_numbering,
                               rank={i: r for r, i in enumerate(indices)})
        for name, index in chip_of.items():
            core = cores.parse_core_device(name)
            if core is not None:
                status[name] = core_status(by_index[index], core[1], inventory.lnc, effective, self.core_numbering,
                                           indices.index(index))
        if whole_node:  # one device in the claim: all the node's /dev nodes go with it
            nodes = tuple(device_node(i) for i in indices)
            edits = {us_dra.NODE_DEVICE: ContainerEdits(device_nodes=nodes)}
            status = {us_dra.NODE_DEVICE: DeviceStatusData({
                "neuronDevices": format_core_list(indices), "visibleCores": env[0][1],
                **({"logicalNeuronCore": effective} if effective is not None else {})})}
        return RequestEdits(edits, ContainerEdits(env=tuple(env)), status)


def device_status(devices: Sequence[NeuronDevice], lnc: int | None, numbering: CoreNumbering,
                  rank: Mapping[int, int]) -> dict[str, DeviceStatusData]:
    """Each chip's ``status.devices`` data: its index, PCI address, the cores the container sees on it (as
    ``NEURON_RT_VISIBLE_CORES`` numbers them: with ``container`` numbering the container's devices renumbered from
    0 in index order (``rank``: chip -> its place among the request's chips), with ``host`` numbering the host's
    indices) and the Logical NeuronCore setting in effect."""
    out: dict[str, DeviceStatusData] = {}
    for dev in devices:
        visible = coreids.core_ids(rank[dev.index] if numbering == "container" else dev.index,
                                   coreids.logical_cores(dev.core_count, lnc))
        data: dict[str, object] = {"index": dev.index, "visibleCores": format_core_list(visible)}
        if dev.pci_address:
            data["pciBusID"] = dev.pci_address
        if lnc is not None:
            data["logicalNeuronCore"] = lnc
        out[device_name(dev.index)] = DeviceStatusData(data)
    return out


def core_status(dev: NeuronDevice, core: int, node_lnc: int | None, lnc: int | None, numbering: CoreNumbering,
                place: int) -> DeviceStatusData:
    """A core device's ``status.devices`` data: its chip, its logical core there, and the cores the container sees
    for it (its physical cores at the LNC in effect, numbered as :func:`device_status` numbers them)."""
    width, chip = lnc or 1, place if numbering == "container" else dev.index
    per_device = coreids.logical_cores(dev.core_count, lnc)
    local = sorted({p // width for p in coreids.core_ids(core, node_lnc or 1)})
    data: dict[str, object] = {"index": dev.index, "coreIndex": core,
                               "visibleCores": format_core_list(coreids.core_id(chip, per_device, c) for c in local)}
    if lnc is not None:
        data["logicalNeuronCore"] = lnc
    return DeviceStatusData(data)
