"""UltraServer facts (neuron.md sections 1.3, 2.4 and 2.5), shared by discovery, both Neuron daemons and the fake host.

A Trn2 UltraServer is 4 ``trn2u.48xlarge`` nodes. The Neuron driver publishes, in ``/sys/class/neuron_device/``:

- ``server_id_2`` / ``server_id_4``: the id (``%016llx``) of the 2-node and 4-node set this node belongs to;
- ``node_id_2`` / ``node_id_4``: this node's place in that set (``0..1`` and ``0..3``);
- ``ultraserver_mode``: the comma list of supported runtime modes (enum below), or ``busy`` while the nodes elect.

A node that is not part of an UltraServer reports node ids ``-1``, server ids ``0000000000000000`` and an empty mode.

Choices where no public document says (docs/neuron-dra-driver.md, "UltraServer choices", repeats them):

- a claim's ``ultraserverMode`` (1, 2 or 4) is the number of nodes in the set; it maps to the runtime enum
  ``X1`` (4), ``X2H`` (2) and ``X4`` (1). ``X2V`` (3) is a 2-node set too, so a node that supports only ``X2V``
  still accepts mode 2 and the runtime gets 3;
- the node label ``ultraserver-mode`` lists the set sizes the node supports, ascending, joined by ``_`` (``1_2_4``);
- mode 1 (the node alone) uses ``server_id_4`` as the server id and node id 0.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from dataclasses import dataclass

NODES_PER_ULTRASERVER = 4
SET_SIZES = (1, 2, 4)
"""The sizes a claim's ``ultraserverMode`` may ask for."""

#: Runtime enum (``NEURON_RT_ULTRASERVER_MODE`` and ``ultraserver_mode`` values) -> nodes in the set.
RUNTIME_MODES: dict[int, tuple[str, int]] = {1: ("X4", 4), 2: ("X2H", 2), 3: ("X2V", 2), 4: ("X1", 1)}
#: Set size -> runtime modes that give it, in order of preference.
MODES_FOR_SIZE: dict[int, tuple[int, ...]] = {4: (1,), 2: (2, 3), 1: (4,)}
ALL_RUNTIME_MODES = (1, 2, 3, 4)

BUSY = "busy"
NO_NODE_ID = -1
NO_SERVER_ID = "0" * 16
SERVER_ID_DIGITS = 16

CLASS_ATTRIBUTES = ("node_id_2", "node_id_4", "server_id_2", "server_id_4", "ultraserver_mode")

LABEL_PREFIX = "neuron.amazonaws.com/"
LABEL_MODE = f"{LABEL_PREFIX}ultraserver-mode"
LABEL_SERVER_ID_2 = f"{LABEL_PREFIX}ultraserver-server-id-2"
LABEL_NODE_ID_2 = f"{LABEL_PREFIX}ultraserver-node-id-2"
LABEL_SERVER_ID_4 = f"{LABEL_PREFIX}ultraserver-server-id-4"
LABEL_NODE_ID_4 = f"{LABEL_PREFIX}ultraserver-node-id-4"
NODE_LABELS = (LABEL_MODE, LABEL_SERVER_ID_2, LABEL_NODE_ID_2, LABEL_SERVER_ID_4, LABEL_NODE_ID_4)

ENV_MODE = "NEURON_RT_ULTRASERVER_MODE"
ENV_SERVER_ID = "NEURON_RT_ULTRASERVER_SERVER_ID"
ENV_NODE_ID = "NEURON_RT_ULTRASERVER_NODE_ID"
ENV_GLOBAL_TOPOID = "NEURON_GLOBAL_TOPOID"


@dataclass(frozen=True)
class UltraServerIds:
    """What one node of an UltraServer reports (the class attributes, parsed)."""

    server_id_2: str
    node_id_2: int
    server_id_4: str
    node_id_4: int
    modes: tuple[int, ...]
    """Supported runtime modes; empty while ``busy``."""
    busy: bool = False

    def set_sizes(self) -> tuple[int, ...]:
        """The set sizes the node supports, ascending."""
        return tuple(sorted({RUNTIME_MODES[m][1] for m in self.modes if m in RUNTIME_MODES}))

    def server_id(self, size: int) -> str:
        return self.server_id_2 if size == 2 else self.server_id_4

    def node_id(self, size: int) -> int:
        return {1: 0, 2: self.node_id_2, 4: self.node_id_4}[size]

    def runtime_mode(self, size: int) -> int | None:
        """The runtime enum for a set of ``size`` nodes that this node supports, or None."""
        return next((m for m in MODES_FOR_SIZE.get(size, ()) if m in self.modes), None)


def mode_label(sizes: Iterable[int]) -> str:
    """``(1, 2, 4)`` -> ``1_2_4``."""
    return "_".join(str(s) for s in sorted(set(sizes)))


def node_labels(ids: UltraServerIds | None) -> dict[str, str | None]:
    """The node labels for ``ids``; every label maps to None (remove) on a node outside an UltraServer.

    While the driver says ``busy`` (an election), the server and node ids stay and the mode label is removed.
    """
    if ids is None:
        return dict.fromkeys(NODE_LABELS)
    sizes = ids.set_sizes()
    return {
        LABEL_MODE: mode_label(sizes) if sizes and not ids.busy else None,
        LABEL_SERVER_ID_2: ids.server_id_2,
        LABEL_NODE_ID_2: str(ids.node_id_2),
        LABEL_SERVER_ID_4: ids.server_id_4,
        LABEL_NODE_ID_4: str(ids.node_id_4),
    }


def fake_ids(ultraserver: str, node: int) -> UltraServerIds:
    """The ids a node ``node`` (0..3) of fake UltraServer ``ultraserver`` reports: server ids derived from the name,
    nodes 0-1 and 2-3 form the two 2-node sets, every mode supported."""
    if not 0 <= node < NODES_PER_ULTRASERVER:
        raise ValueError(f"UltraServer node must be 0..{NODES_PER_ULTRASERVER - 1}, got {node}")

    def server(*parts: str) -> str:
        return hashlib.sha256("/".join(("ultraserver", ultraserver, *parts)).encode()).hexdigest()[:SERVER_ID_DIGITS]

    return UltraServerIds(server_id_2=server("2", str(node // 2)), node_id_2=node % 2,
                          server_id_4=server("4"), node_id_4=node, modes=ALL_RUNTIME_MODES)


def class_files(ids: UltraServerIds | None) -> dict[str, str]:
    """The class attribute files (name -> content) the driver writes for ``ids`` (None: not in an UltraServer)."""
    if ids is None:
        return {"node_id_2": f"{NO_NODE_ID}\n", "node_id_4": f"{NO_NODE_ID}\n", "server_id_2": f"{NO_SERVER_ID}\n",
                "server_id_4": f"{NO_SERVER_ID}\n", "ultraserver_mode": "\n"}
    mode = BUSY if ids.busy else ",".join(str(m) for m in ids.modes)
    return {"node_id_2": f"{ids.node_id_2}\n", "node_id_4": f"{ids.node_id_4}\n",
            "server_id_2": f"{ids.server_id_2}\n", "server_id_4": f"{ids.server_id_4}\n",
            "ultraserver_mode": f"{mode}\n"}
