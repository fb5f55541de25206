"""The ``fake-sysfs`` fault verbs: change a tree written earlier the way a node's hardware would change, while the
daemons watch it. Each verb is one :class:`~accel_core.fakehost.host.FakeHost` mutation, the same the tests use.

    fake-sysfs port DIR DEVICE down|up|init|armed [--port N]
    fake-sysfs neuron-error DIR neuronN [--counter NAME] [--count N]  |  --clear
    fake-sysfs remove DIR DEVICE [--dev-node]
    fake-sysfs restore DIR DEVICE
    fake-sysfs show DIR

DEVICE is a name a user sees: an RDMA device (``rdmap79s0``, ``efa_0``) or a Neuron device (``neuron3``). Exit
status 0 on success, 2 on bad input; the message names the device and lists the valid ones.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from accel_core.fakehost.fsops import FakeHostError
from accel_core.fakehost.host import MARKER, FakeHost, removed_phrase
from accel_core.fakehost.neuron import NEURON_HW_COUNTERS

#: ``port`` state words -> the sysfs state the FakeHost writes (``up`` is ACTIVE)
PORT_STATES = {"down": "DOWN", "up": "ACTIVE", "active": "ACTIVE", "init": "INIT", "armed": "ARMED"}


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="fake-sysfs", description="Inject a fault into a fake host tree (written by `fake-sysfs "
        "--instance-type TYPE DIR`) while the daemons run against it. DEVICE is a name the daemons log: "
        "rdmap79s0 (EFA), neuron3 (Neuron); `fake-sysfs show DIR` lists them.")
    sub = p.add_subparsers(dest="verb", required=True, metavar="VERB")

    port = sub.add_parser("port", help="set an EFA/RDMA port down or up (the EFA health rule: a port not ACTIVE "
                          "makes the device Unhealthy, reason PortDown)",
                          description="Set a port's state and phys_state, as a link going down or up would.")
    _dir_and_device(port)
    port.add_argument("state", choices=list(PORT_STATES), help="down (1: DOWN), up (4: ACTIVE), init or armed")
    port.add_argument("--port", type=int, default=1, metavar="N", help="port number (default 1)")
    port.set_defaults(run=_port)

    err = sub.add_parser("neuron-error", help="add uncorrected ECC errors to a Neuron device (unhealthy until "
                         "cleared), or --clear them as a driver reload would",
                         description="Add errors to a Neuron device's stats/hardware/<counter> (total and "
                         "present). mem_ecc_uncorrected and sram_ecc_uncorrected make the device unhealthy "
                         "(reason UncorrectedErrors) until they read 0 again; --clear sets every hardware counter "
                         "to 0, as a Neuron driver reload does.")
    _dir_and_device(err, "a Neuron device, e.g. neuron3")
    err.add_argument("--counter", choices=NEURON_HW_COUNTERS, default="mem_ecc_uncorrected",
                     help="which counter (default mem_ecc_uncorrected)")
    group = err.add_mutually_exclusive_group()
    group.add_argument("--count", type=int, metavar="N", help="errors to add (default 1)")
    group.add_argument("--clear", action="store_true", help="set every hardware counter of the device to 0")
    err.set_defaults(run=_neuron_error)

    rm = sub.add_parser("remove", help="remove a device (EFA or Neuron) as if its driver lost it",
                        description="Remove a device's sysfs entries, PCI function and /dev node (or, with "
                        "--dev-node, only its /dev node). `fake-sysfs restore` puts back exactly what was removed, "
                        "from any later process.")
    _dir_and_device(rm)
    rm.add_argument("--dev-node", action="store_true", help="remove only the /dev node; sysfs stays")
    rm.set_defaults(run=_remove)

    back = sub.add_parser("restore", help="put back a removed device (or its /dev node)",
                          description="Put back what `fake-sysfs remove` removed of DEVICE.")
    _dir_and_device(back)
    back.set_defaults(run=_restore)

    show = sub.add_parser("show", help="list the devices with their state (port, hw errors, removed)",
                          description="List DIR's devices: kind, /dev node, and state as the health rules see it.")
    show.add_argument("dir", type=Path, metavar="DIR", help="the fake host tree")
    show.set_defaults(run=_show)
    return p


VERBS = ("port", "neuron-error", "remove", "restore", "show")


def _dir_and_device(p: argparse.ArgumentParser, what: str = "e.g. rdmap79s0 or neuron3") -> None:
    p.add_argument("dir", type=Path, metavar="DIR", help="the fake host tree (on a rig node: $HOST_ROOT)")
    p.add_argument("device", metavar="DEVICE", help=what)


def main(argv: Sequence[str], fail: Callable[[str], int]) -> int:
    args = parser().parse_args(argv)
    root: Path = args.dir
    if not (root / MARKER).is_file():
        hint = ("" if root.exists() else "; on a containerd rig node HOST_ROOT is the path inside the node: use "
                "FAKE_HOST_DIR from `accel-cluster node-env NODE`")
        return fail(f"{root} is not a fake-sysfs tree (no {MARKER}); write one with "
                    f"`fake-sysfs --instance-type TYPE {root}`{hint}")
    try:
        host = FakeHost.attach(root)
        line: str = args.run(host, args)
    except (FakeHostError, OSError) as exc:
        return fail(str(exc))
    try:
        print(line, flush=True)
    except BrokenPipeError:  # `fake-sysfs show DIR | head`: the reader has what it wanted
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return 0


def _present(host: FakeHost, device: str) -> None:
    gone = host.removed_parts(device)
    if gone:
        raise FakeHostError(f"{removed_phrase(device, gone)}; `fake-sysfs restore {host.root} {device}` first")


def _port(host: FakeHost, args: argparse.Namespace) -> str:
    part = host.part_of(args.device)
    if not hasattr(part, "set_port_state"):
        raise FakeHostError(f"{args.device} is a {part.device_kind(args.device)} device and has no ports; "
                            f"ports belong to RDMA devices ({_names(host, 'port_state')})")
    _present(host, args.device)
    before = host.port_state(args.device, args.port)
    host.set_port_state(args.device, PORT_STATES[args.state], args.port)
    return f"{args.device} port {args.port}: {before} -> {host.port_state(args.device, args.port)}"


def _neuron_error(host: FakeHost, args: argparse.Namespace) -> str:
    part = host.part_of(args.device)
    if not hasattr(part, "add_hw_errors"):
        raise FakeHostError(f"{args.device} is not a Neuron device ({_names(host, 'add_hw_errors')})")
    _present(host, args.device)
    index = host.index_of(args.device)
    if args.clear:
        host.clear_hw_errors(index)
        return f"{args.device}: every stats/hardware counter is 0 (as after a Neuron driver reload)"
    count = 1 if args.count is None else args.count
    total = host.add_hw_errors(index, args.counter, count)
    return f"{args.device}: stats/hardware/{args.counter}/total = {total} (+{count})"


def _remove(host: FakeHost, args: argparse.Namespace) -> str:
    host.remove_device(args.device, dev_node_only=args.dev_node)
    what = host.part_of(args.device).dev_node(args.device) if args.dev_node else "sysfs, PCI function, /dev node"
    return f"removed {args.device} ({what}); `fake-sysfs restore {host.root} {args.device}` puts it back"


def _restore(host: FakeHost, args: argparse.Namespace) -> str:
    gone = host.removed_parts(args.device)
    host.restore_device(args.device)
    return f"restored {args.device} ({' and '.join(gone)})"


def _show(host: FakeHost, args: argparse.Namespace) -> str:
    rows = [("DEVICE", "KIND", "DEV NODE", "STATE")]
    for name, part in host.devices().items():
        gone = host.removed_parts(name)
        state = f"removed ({' and '.join(gone)})" if gone else part.device_state(name)
        rows.append((name, part.device_kind(name), part.dev_node(name), state))
    if len(rows) == 1:
        return f"{host.instance_type} at {host.root}: no devices"
    widths = [max(len(r[i]) for r in rows) for i in range(3)]
    table = "\n".join("  ".join([*(c.ljust(w) for c, w in zip(r[:3], widths, strict=True)), r[3]]).rstrip()
                      for r in rows)
    return f"{host.instance_type} at {host.root}\n{table}"


def _names(host: FakeHost, method: str) -> str:
    """The host's devices whose part has ``method``, for an error naming the valid ones."""
    names = [name for name, part in host.devices().items() if hasattr(part, method)]
    return f"this {host.instance_type} has: {', '.join(names)}" if names else f"this {host.instance_type} has none"
