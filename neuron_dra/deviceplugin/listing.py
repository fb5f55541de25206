"""``neuron-device-plugin ls``: what the plugin would advertise, as JSON or as a neuron-ls style table."""

from __future__ import annotations

import argparse
import json
from typing import Any

from accel_core.paths import HostPaths
from neuron_dra import COEXISTENCE
from neuron_dra.coreids import core_ids
from neuron_dra.deviceplugin.inuse import NEURON, NEURONCORE
from neuron_dra.discovery import NeuronInventory, discover
from neuron_dra.facts import ultraserver

GIB = 1024**3


def inventory_report(inv: NeuronInventory, blocked: str | None = None) -> dict[str, Any]:
    """The JSON document ``ls --output json`` prints."""
    per = inv.logical_cores_per_device()
    devices = []
    for dev in inv.devices:
        devices.append({
            "index": dev.index,
            "dev_node": dev.dev_node,
            "present": dev.present,
            "arch": dev.arch,
            "device_name": dev.device_name,
            "physical_cores": dev.core_count,
            "logical_cores": per,
            "core_ids": list(core_ids(dev.index, per)),
            "memory_bytes": dev.memory_bytes,
            "connected_devices": list(dev.connected),
            "pci_address": dev.pci_address,
            "numa_node": dev.numa_node,
            "pcie_root": dev.pcie_root,
            "uncorrected_errors": dev.uncorrected_errors,
            "problems": list(dev.problems),
        })
    return {
        "instance_type": inv.instance_type,
        "driver_version": inv.driver_version,
        "logical_nc_config": inv.lnc if inv.lnc_applies else None,
        "topology": inv.topology.kind,
        "resources": {NEURON: len(inv.devices), NEURONCORE: inv.total_logical_cores()},
        "advertising_blocked": blocked,
        "ultraserver": _ultraserver_report(inv),
        "node_labels": {k: v for k, v in ultraserver.node_labels(inv.ultraserver).items() if v is not None},
        "devices": devices,
        "problems": list(inv.problems),
    }


def _ultraserver_report(inv: NeuronInventory) -> dict[str, Any] | None:
    ids = inv.ultraserver
    if ids is None:
        return None
    return {"server_id_2": ids.server_id_2, "node_id_2": ids.node_id_2, "server_id_4": ids.server_id_4,
            "node_id_4": ids.node_id_4, "modes": list(ids.modes), "busy": ids.busy, "set_sizes": list(ids.set_sizes())}


def _ultraserver_line(inv: NeuronInventory) -> str:
    ids = inv.ultraserver
    if ids is None:
        return "ultraserver: none"
    modes = "busy (election running)" if ids.busy else ultraserver.mode_label(ids.set_sizes()) or "none"
    return (f"ultraserver: server-id-4 {ids.server_id_4} node-id-4 {ids.node_id_4}, server-id-2 {ids.server_id_2} "
            f"node-id-2 {ids.node_id_2}, set sizes {modes}")


def _memory(nbytes: int) -> str:
    return f"{nbytes // GIB} GB" if nbytes else "-"


def _bdf(address: str | None) -> str:
    if not address:
        return "-"
    return address[5:] if address.startswith("0000:") else address


def inventory_table(inv: NeuronInventory, blocked: str | None = None) -> str:
    """A neuron-ls style table: device, cores, memory, connected devices, PCI BDF, NUMA node."""
    per = inv.logical_cores_per_device()
    header = [("NEURON", "DEVICE"), ("NEURON", "CORES"), ("NEURON", "MEMORY"), ("CONNECTED", "DEVICES"),
              ("PCI", "BDF"), ("NUMA", "NODE")]
    rows = []
    for dev in inv.devices:
        rows.append([f"{dev.index}" + ("" if dev.present else " (missing)"), str(per), _memory(dev.memory_bytes),
                     ", ".join(map(str, dev.connected)), _bdf(dev.pci_address),
                     "-" if dev.numa_node is None else str(dev.numa_node)])
    widths = [max(len(h[0]), len(h[1]), *(len(r[i]) for r in rows)) for i, h in enumerate(header)]
    rule = "+" + "+".join("-" * (w + 2) for w in widths) + "+"

    def line(cells: list[str]) -> str:
        return "|" + "|".join(f" {c:<{w}} " for c, w in zip(cells, widths, strict=True)) + "|"

    out = [
        f"instance-type: {inv.instance_type or 'unknown'}",
        f"driver-version: {inv.driver_version or 'unknown'}",
        f"logical-nc-config: {inv.lnc if inv.lnc_applies else 'n/a'}",
        f"topology: {inv.topology.kind}",
        _ultraserver_line(inv),
    ]
    if rows:
        out += [rule, line([h[0] for h in header]), line([h[1] for h in header]), rule,
                *(line(r) for r in rows), rule]
    else:
        out.append("no Neuron devices found")
    out.append(f"resources: {NEURON}={len(inv.devices)} {NEURONCORE}={inv.total_logical_cores()}")
    if blocked:
        out.append(f"advertising blocked: {blocked}")
    out += [f"problem: {p}" for p in inv.all_problems()]
    return "\n".join(out)


def ls(paths: HostPaths, args: argparse.Namespace) -> str:
    """``neuron-device-plugin ls``: the host's devices and the counts the plugin would advertise, table or JSON."""
    inv = discover(paths)
    blocked = COEXISTENCE.device_plugin_blocked(paths)
    return json.dumps(inventory_report(inv, blocked), indent=2) if args.output == "json" else inventory_table(
        inv, blocked)
