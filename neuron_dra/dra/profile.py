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
- nothing is published or prepared while the Neuron device plugin runs on the node.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from accel_core.awsfacts import ultraserver as us_facts
from accel_core.dra.profile import RequestEdits, Scan
from accel_core.dra.slicemodel import CounterSet
from accel_core.dra.types import ClaimError, DeviceStatusData
from accel_core.edits import ContainerEdits
from accel_core.paths import HostPaths
from neuron_dra import DRA_DRIVER_NAME
from neuron_dra.discovery import NeuronDevice, NeuronInventory
from neuron_dra.dra import ultraserver as us_dra
from neuron_dra.dra.attributes import NODE_LABEL_ATTRIBUTES, device_index, device_name, slice_devices
from neuron_dra.dra.config import NeuronConfig, decode_parameters
from neuron_dra.edits import CoreNumbering, device_node, format_core_list, runtime_env
from neuron_dra.scanner import NeuronScanner


class NeuronProfile:
    """:class:`~accel_core.dra.profile.DraProfile` for Neuron devices. On the Neuron host scanner."""

    driver_name: str = DRA_DRIVER_NAME
    metrics_prefix: str = "neuron_dra"
    default_config: NeuronConfig = NeuronConfig()

    def __init__(self, scanner: NeuronScanner | None = None, *, core_numbering: CoreNumbering = "container") -> None:
        self.scanner = scanner if scanner is not None else NeuronScanner()
        self.core_numbering: CoreNumbering = core_numbering

    def scan(self, paths: HostPaths, dra_version: str) -> Scan[NeuronInventory]:
        host = self.scanner.scan(paths)
        inv = host.inventory
        health = {device_name(d.index): host.health[str(d.index)] for d in inv.devices}
        summary = dict(host.summary)
        devices = slice_devices(inv, dra_version)
        counters: tuple[CounterSet, ...] = ()
        ids = inv.ultraserver
        if ids is not None and devices:
            devices = [replace(d, consumes=us_dra.chip_consumes()) for d in devices]
            devices.append(us_dra.node_device(ids, inv.instance_type, inv.driver_version, dra_version,
                                              len(inv.devices)))
            counters = (us_dra.chip_counters(len(inv.devices)),)
            sick = next((h for h in health.values() if not h.healthy), None)
            if sick is not None:  # the node's share is only as good as its worst chip
                health[us_dra.NODE_DEVICE] = sick
            summary = {**summary, "ultraserver": ids.server_id_4, "ultraserver_node": ids.node_id_4}
        return Scan(inv, tuple(devices), health, host.problems, summary, counters=counters,
                    node_labels=us_facts.node_labels(ids), node_label_attributes=NODE_LABEL_ATTRIBUTES)

    def decode_config(self, parameters: object, where: str) -> NeuronConfig:
        return decode_parameters(parameters, where)

    def container_edits(self, inventory: NeuronInventory, request: str, devices: Sequence[str],
                        config: NeuronConfig) -> RequestEdits:
        """``/dev/neuron<i>`` per device (in index order) and the request's NeuronCore env."""
        by_index = {d.index: d for d in inventory.devices}
        indices: list[int] = []
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
        for name in devices:
            index = device_index(name)
            if index is None or index not in by_index:
                raise ClaimError(f"device {name} (request {request}) is not a Neuron device of this node "
                                 f"(devices: {', '.join(device_name(i) for i in sorted(by_index)) or 'none'})")
            if not by_index[index].present:
                raise ClaimError(f"device {name} (request {request}) is not present on this node: "
                                 f"{'; '.join(by_index[index].problems) or 'missing'}")
            indices.append(index)
        lnc = config.logical_neuron_core
        if lnc is not None and not inventory.lnc_applies:
            kind = inventory.devices[0].device_name if inventory.devices else inventory.arch
            node = inventory.instance_type or "this node"
            raise ClaimError(f"request {request}: logicalNeuronCore: {lnc} is set, but {node} ({kind}) has no "
                             "Logical NeuronCore setting")
        effective = lnc if lnc is not None else (inventory.lnc if inventory.lnc_applies else None)
        cores: list[int] = []
        per_device = 1
        for index in sorted(indices):
            per_device = max(1, by_index[index].core_count // (effective or 1))
            cores.extend(range(index * per_device, (index + 1) * per_device))
        env = list(runtime_env(cores, cores_per_device=per_device, lnc=lnc, numbering=self.core_numbering))
        if config.ultraserver_mode is not None:
            env.extend(us_dra.runtime_env(inventory.ultraserver, config.ultraserver_mode, request,
                                          inventory.instance_type or "this node"))
        edits = {device_name(i): ContainerEdits(device_nodes=(device_node(i),)) for i in sorted(indices)}
        status = device_status([by_index[i] for i in sorted(indices)], effective, self.core_numbering)
        if whole_node:  # one device in the claim: all the node's /dev nodes go with it
            nodes = tuple(n for e in edits.values() for n in e.device_nodes)
            edits = {us_dra.NODE_DEVICE: ContainerEdits(device_nodes=nodes)}
            status = {us_dra.NODE_DEVICE: DeviceStatusData({
                "neuronDevices": format_core_list(indices), "visibleCores": env[0][1],
                **({"logicalNeuronCore": effective} if effective is not None else {})})}
        return RequestEdits(edits, ContainerEdits(env=tuple(env)), status)


def device_status(devices: Sequence[NeuronDevice], lnc: int | None,
                  numbering: CoreNumbering = "container") -> dict[str, DeviceStatusData]:
    """Each device's ``status.devices`` data: its index, PCI address, the cores the container sees on it (as
    ``NEURON_RT_VISIBLE_CORES`` numbers them: with ``container`` numbering the container's devices renumbered from
    0 in index order, with ``host`` numbering the host's indices) and the Logical NeuronCore setting in effect."""
    out: dict[str, DeviceStatusData] = {}
    for rank, dev in enumerate(devices):
        per_device = max(1, dev.core_count // (lnc or 1))
        first = (rank if numbering == "container" else dev.index) * per_device
        data: dict[str, object] = {"index": dev.index,
                                   "visibleCores": format_core_list(range(first, first + per_device))}
        if dev.pci_address:
            data["pciBusID"] = dev.pci_address
        if lnc is not None:
            data["logicalNeuronCore"] = lnc
        out[device_name(dev.index)] = DeviceStatusData(data)
    return out
