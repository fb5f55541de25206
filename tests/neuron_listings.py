"""``neuron-ls`` rows of real instances, written down from public listings: the oracle for the PCI address, NUMA
node and neighbour facts of the fake hosts (and so of the instance catalog in ``accel_core/awsfacts``).

Each row is ``index: (connected devices in printed order, PCI BDF, NUMA node or None when not printed)``. Only what
the listings print is here; the CPU-affinity column is not modelled by the project and is left out.

What the listings show beyond single values:

- trn1.32xlarge: two instances list the same buses and NUMA nodes per device index (devices 0, 1, 12, 13 on bus
  0x10; 2, 3, 14, 15 on 0xa0; 4, 5, 8, 9 on 0x20; 6, 7, 10, 11 on 0x90; buses 0x10/0x20 on NUMA 0, 0x90/0xa0 on
  NUMA 1) but different slots within a bus, so only the bus, the NUMA node and the set of addresses are facts of the
  instance type.
- trn2: the only 16-device listing with addresses is the Neuron SDK's neuron-ls guide (printed as trn2n.48xlarge,
  logical-neuroncore-config 2); a real trn2.48xlarge (2026, runtime 2.34) that exposed one device to a container
  prints that device (neighbours 12, 1, 9, 14: device 13) at the same address and NUMA node. The neighbour order
  differs between the two: the guide prints the trn1 order (up, left, down, right), the trn2.48xlarge the
  trn2 driver order, so for trn2 the neighbour *sets* come from the guide and the order from the real instance.
"""

from __future__ import annotations

Row = tuple[tuple[int, ...], str, int | None]

# aws-neuron/aws-neuron-sdk tools/neuron-sys-tools/neuron-ls.rst (commit 93e9f5d82b785fbe98bfa08d3715308b5588c40d),
# "neuron-ls" on a trn2n.48xlarge: NEURON DEVICE, CONNECTED DEVICES, PCI BDF, NUMA NODE columns.
TRN2_48XLARGE_GUIDE: dict[int, Row] = {
    0: ((12, 3, 4, 1), "0000:cc:00.0", 1), 1: ((13, 0, 5, 2), "0000:b5:00.0", 1),
    2: ((14, 1, 6, 3), "0000:b6:00.0", 1), 3: ((15, 2, 7, 0), "0000:cb:00.0", 1),
    4: ((0, 7, 8, 5), "0000:6f:00.0", 0), 5: ((1, 4, 9, 6), "0000:58:00.0", 0),
    6: ((2, 5, 10, 7), "0000:59:00.0", 0), 7: ((3, 6, 11, 4), "0000:6e:00.0", 0),
    8: ((4, 11, 12, 9), "0000:9b:00.0", 0), 9: ((5, 8, 13, 10), "0000:84:00.0", 0),
    10: ((6, 9, 14, 11), "0000:85:00.0", 0), 11: ((7, 10, 15, 8), "0000:9a:00.0", 0),
    12: ((8, 15, 0, 13), "0000:f8:00.0", 1), 13: ((9, 12, 1, 14), "0000:e1:00.0", 1),
    14: ((10, 13, 2, 15), "0000:e2:00.0", 1), 15: ((11, 14, 3, 12), "0000:f7:00.0", 1),
}

# A public environment report from a trn2.48xlarge (instance i-0dcf246b9a7d5f066, 2026-10-10, Neuron runtime
# 2.34.10; found by content search of public GitHub files, repository not recorded by the index): the one device
# visible in the container, with `neuron-ls --json-output` giving the same connected_to, bdf and numa_node.
TRN2_48XLARGE_DEVICE_13: Row = ((12, 1, 9, 14), "0000:e1:00.0", 1)

# trn1.32xlarge, SageMaker HyperPod worker (instance i-0fc767be0ec5465d7, 2026; public GitHub markdown found by
# content search): neuron-ls with PCI BDF, CPU AFFINITY and NUMA NODE columns.
TRN1_32XLARGE_HYPERPOD: dict[int, Row] = {
    0: ((12, 3, 4, 1), "0000:10:1b.0", 0), 1: ((13, 0, 5, 2), "0000:10:1e.0", 0),
    2: ((14, 1, 6, 3), "0000:a0:1b.0", 1), 3: ((15, 2, 7, 0), "0000:a0:1e.0", 1),
    4: ((0, 7, 8, 5), "0000:20:1e.0", 0), 5: ((1, 4, 9, 6), "0000:20:1c.0", 0),
    6: ((2, 5, 10, 7), "0000:90:1e.0", 1), 7: ((3, 6, 11, 4), "0000:90:1c.0", 1),
    8: ((4, 11, 12, 9), "0000:20:1d.0", 0), 9: ((5, 8, 13, 10), "0000:20:1b.0", 0),
    10: ((6, 9, 14, 11), "0000:90:1d.0", 1), 11: ((7, 10, 15, 8), "0000:90:1b.0", 1),
    12: ((8, 15, 0, 13), "0000:10:1c.0", 0), 13: ((9, 12, 1, 14), "0000:10:1d.0", 0),
    14: ((10, 13, 2, 15), "0000:a0:1c.0", 1), 15: ((11, 14, 3, 12), "0000:a0:1d.0", 1),
}

# trn1.32xlarge in the Neuron SDK's "neuron-ls --topology" example (instance i-0633517e496256bf8) and, with the
# same rows, the awslabs/data-on-eks Trainium blueprint (website/docs/blueprints/ai-ml/trainium.md, earlier
# revision; instance i-04b476a6a0e686980). No NUMA column.
TRN1_32XLARGE_SDK: dict[int, Row] = {
    0: ((12, 3, 4, 1), "0000:10:1c.0", None), 1: ((13, 0, 5, 2), "0000:10:1d.0", None),
    2: ((14, 1, 6, 3), "0000:a0:1c.0", None), 3: ((15, 2, 7, 0), "0000:a0:1d.0", None),
    4: ((0, 7, 8, 5), "0000:20:1b.0", None), 5: ((1, 4, 9, 6), "0000:20:1c.0", None),
    6: ((2, 5, 10, 7), "0000:90:1b.0", None), 7: ((3, 6, 11, 4), "0000:90:1c.0", None),
    8: ((4, 11, 12, 9), "0000:20:1d.0", None), 9: ((5, 8, 13, 10), "0000:20:1e.0", None),
    10: ((6, 9, 14, 11), "0000:90:1d.0", None), 11: ((7, 10, 15, 8), "0000:90:1e.0", None),
    12: ((8, 15, 0, 13), "0000:10:1e.0", None), 13: ((9, 12, 1, 14), "0000:10:1b.0", None),
    14: ((10, 13, 2, 15), "0000:a0:1e.0", None), 15: ((11, 14, 3, 12), "0000:a0:1b.0", None),
}

# inf2.48xlarge in a public blog post on serving with the Hugging Face Neuron containers (public GitHub markdown
# found by content search): neuron-ls without a NUMA column.
INF2_48XLARGE_BLOG: dict[int, Row] = {
    0: ((11, 1), "0000:80:1e.0", None), 1: ((0, 2), "0000:90:1e.0", None), 2: ((1, 3), "0000:80:1d.0", None),
    3: ((2, 4), "0000:90:1f.0", None), 4: ((3, 5), "0000:80:1f.0", None), 5: ((4, 6), "0000:90:1d.0", None),
    6: ((5, 7), "0000:20:1e.0", None), 7: ((6, 8), "0000:20:1f.0", None), 8: ((7, 9), "0000:10:1e.0", None),
    9: ((8, 10), "0000:10:1f.0", None), 10: ((9, 11), "0000:10:1d.0", None), 11: ((10, 0), "0000:20:1d.0", None),
}


def bus(bdf: str) -> str:
    """``0000:10:1b.0`` -> ``0000:10``: the domain and bus, shared by every device behind one PCI root bus."""
    return bdf.rsplit(":", 1)[0]
