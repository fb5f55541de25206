"""The demo's trn2 topology table: one row per device of the slices ``neuron-dra-driver slices`` prints, with the
catalog's PCI address, NUMA node and EFA, and the 4x4 torus position and groups (docs/neuron-dra-driver.md)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from accel_rig.demo import topology_table
from hostcache import shared_host

from accel_core.awsfacts import catalog
from efa_plugin.facts import neuron_efa_map

REPO = Path(__file__).resolve().parents[3]


def test_trn2_topology_table_has_16_rows_from_the_published_slices() -> None:
    root = shared_host("trn2.48xlarge").root
    out = subprocess.run([sys.executable, "-m", "neuron_dra.dra.cli", "slices", "--host-root", str(root),
                          "--node-name", "trn2-node-1", "--output", "json"], capture_output=True, text=True,
                         check=True, timeout=60, cwd=REPO).stdout
    devices = [d for s in json.loads(out) for d in s["spec"]["devices"]]
    header, *rows = topology_table(devices)
    assert header.split() == ["DEVICE", "BDF", "NUMA", "POSITION", "(x,y)", "ROW", "HALF", "EFA"]
    assert len(rows) == 16
    spec = catalog.get("trn2.48xlarge")
    assert spec.neuron is not None
    efa = neuron_efa_map(spec)
    for i, row in enumerate(rows):
        fn = spec.neuron.devices[i].pci
        # torus position: row i // 4, column i % 4; groups of 4 are rows, groups of 8 two rows
        assert row.split() == [f"neuron-device-{i}", fn.bdf, str(fn.numa_node), f"({i // 4},{i % 4})",
                               str(i // 4), str(i // 8), efa[i]], row
