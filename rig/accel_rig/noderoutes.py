"""Where the API server finds each containerd node of the rig (dev-only): one JSON file per node in the control
plane's ``routes/`` directory, written by the node when it starts and read by the egress proxy
(:mod:`accel_rig.egressproxy`) on every connection.

Each node gets a *slot* ``s`` (the lowest one no other live node of the control plane holds; a node keeps its slot
across restarts). The slot gives it two things no other node of the cluster has:

- ``127.0.0.(s+2)``: an address of the machine's loopback range (every 127/8 address is already on ``lo``, so
  nothing is added) where a forwarder serves the node's kubelet port, for tools on the machine;
- ``10.(88+s).0.0/16``: the addresses its pods get (``rig/accel_rig/data/accel-veth``), so a pod IP names its node.
"""

from __future__ import annotations

import ipaddress
import json
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from pathlib import Path

from accel_core.atomic import atomic_write_text
from accel_rig.controlplane_processes import process_start_ticks

#: Slots 0..MAX_SLOT: pods in 10.88.0.0/16 .. 10.198.0.0/16 (below the nodes' own 10.201.x.y), loopback
#: 127.0.0.2 .. 127.0.0.112.
MAX_SLOT = 110
FIRST_POD_OCTET = 88
#: The route files' directory in a control plane's state directory (next to its ``pki/``).
ROUTES_DIR = "routes"


def pod_prefix(slot: int) -> str:
    """The first two octets of the pods' addresses on the node of ``slot``."""
    return f"10.{FIRST_POD_OCTET + slot}"


def loopback_ip(slot: int) -> str:
    """The machine-loopback address of the node of ``slot``."""
    return f"127.0.0.{slot + 2}"


def pick_slot(taken: Iterable[int], own: int | None = None) -> int:
    """``own`` if no other node holds it, else the lowest free slot; ValueError when all are taken."""
    held = set(taken)
    if own is not None and 0 <= own <= MAX_SLOT and own not in held:
        return own
    for slot in range(MAX_SLOT + 1):
        if slot not in held:
            return slot
    raise ValueError(f"all {MAX_SLOT + 1} node slots are taken; a rig runs at most that many containerd nodes")


@dataclass(frozen=True)
class NodeRoute:
    """One containerd node as the egress proxy sees it."""

    name: str
    slot: int
    node_ip: str
    kubelet_port: int
    holder_pid: int
    holder_ticks: int

    @property
    def loopback(self) -> str:
        return loopback_ip(self.slot)

    @property
    def pod_prefix(self) -> str:
        return pod_prefix(self.slot)

    @property
    def netns(self) -> str:
        return f"/proc/{self.holder_pid}/ns/net"

    def alive(self) -> bool:
        """The namespace's holder still runs (a reused PID has another start time)."""
        return self.holder_ticks >= 0 and process_start_ticks(self.holder_pid) == self.holder_ticks

    def target(self, host: str) -> str | None:
        """The address inside the node's namespace that ``host`` (as the API server dials it: the node's name, its
        address, its loopback address or a pod IP) means on this node, or None when ``host`` is not this node's."""
        if host in (self.name, self.node_ip, self.loopback):
            return self.node_ip
        try:
            ip = ipaddress.IPv4Address(host)
        except ValueError:
            return None
        return host if ip in ipaddress.IPv4Network(f"{self.pod_prefix}.0.0/16") else None


def route_for(host: str, routes: Iterable[NodeRoute]) -> tuple[NodeRoute, str] | None:
    """The node and the in-namespace address for ``host``, or None when no node has it."""
    for route in routes:
        target = route.target(host)
        if target is not None:
            return route, target
    return None


def load_routes(routes_dir: Path) -> list[NodeRoute]:
    """Every readable route file of ``routes_dir``, by name; a damaged one is skipped (its node rewrites it)."""
    out = []
    for path in sorted(routes_dir.glob("*.json")) if routes_dir.is_dir() else []:
        try:
            raw = json.loads(path.read_text())
            out.append(NodeRoute(name=str(raw["name"]), slot=int(raw["slot"]), node_ip=str(raw["node_ip"]),
                                 kubelet_port=int(raw["kubelet_port"]), holder_pid=int(raw["holder_pid"]),
                                 holder_ticks=int(raw["holder_ticks"])))
        except (OSError, ValueError, KeyError, TypeError):
            continue
    return out


def claim_slot(routes_dir: Path, name: str) -> int:
    """The slot of node ``name``: the one it had, unless a live other node holds it now; else the lowest free one.
    Nodes of one control plane start one after the other, so reading the directory is enough."""
    routes = load_routes(routes_dir)
    own = next((r.slot for r in routes if r.name == name), None)
    return pick_slot((r.slot for r in routes if r.name != name and r.alive()), own)


def save_route(routes_dir: Path, route: NodeRoute) -> Path:
    routes_dir.mkdir(parents=True, exist_ok=True)
    path = routes_dir / f"{route.name}.json"
    atomic_write_text(path, json.dumps(asdict(route)) + "\n", mode=0o644, durable=False)
    return path
