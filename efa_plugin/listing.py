"""``efa-device-plugin ls``: the host's EFAs as the plugin would advertise them (a table, or JSON)."""

from __future__ import annotations

import argparse
import json

from accel_core.paths import HostPaths
from efa_plugin import RESOURCE_NAME
from efa_plugin.discovery import EfaInventory, discover


def inventory_json(inv: EfaInventory) -> dict[str, object]:
    """The ``ls --output json`` document."""
    return {
        "resources": {RESOURCE_NAME: len(inv.devices)},
        "healthy": sum(d.healthy for d in inv.devices),
        "instance_type": inv.instance_type,
        "devices": [d.as_dict() for d in inv.devices],
        "ignored": [{"ibdev": i.ibdev, "uverbs": i.uverbs, "pci_address": i.pci_address, "reason": i.reason}
                    for i in inv.ignored],
        "skipped": list(inv.skipped),
    }


def inventory_table(inv: EfaInventory) -> str:
    """The default ``ls`` output: one row per EFA, then ignored RDMA devices and problems."""
    header = ("ID", "IBDEV", "NODE", "NUMA", "PCIE-ROOT", "PORT", "HEALTH", "NEAR")
    rows = [header]
    for d in inv.devices:
        near = ",".join(d.near_gpus) or ",".join(f"neuron{n}" for n in d.near_neurons) or "-"
        rows.append((d.id, d.ibdev, d.device_node, "-" if d.numa_node is None else str(d.numa_node),
                     d.pcie_root or "-", d.port_state or "-", "Healthy" if d.healthy else "Unhealthy", near))
    widths = [max(len(r[i]) for r in rows) for i in range(len(header))]
    lines = [f"{RESOURCE_NAME}: {len(inv.devices)} ({sum(d.healthy for d in inv.devices)} healthy)"
             f"  instance type: {inv.instance_type or 'unknown'}"]
    if inv.devices:
        lines += ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows]
    for d in inv.devices:
        lines += [f"problem: {d.id} ({d.ibdev}): {p}" for p in d.problems]
    lines += [f"ignored: {i.ibdev} ({i.uverbs}, {i.pci_address}): {i.reason}" for i in inv.ignored]
    lines += [f"skipped: {s}" for s in inv.skipped]
    return "\n".join(lines)


def ls(paths: HostPaths, args: argparse.Namespace) -> str:
    """``efa-device-plugin ls``: the host's EFAs as a table or a JSON document."""
    inv = discover(paths)
    return json.dumps(inventory_json(inv), indent=2) if args.output == "json" else inventory_table(inv)
