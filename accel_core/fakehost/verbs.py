"""The ``fake-sysfs`` fault verbs: change a tree written earlier the way a node's hardware would change, while the
daemons watch it. Each verb is one :class:`~accel_core.fakehost.host.FakeHost` mutation, the same the tests use.

    fake-sysfs remove DIR DEVICE [--dev-node]
    fake-sysfs restore DIR DEVICE
    fake-sysfs show DIR
    fake-sysfs VERB ...   (each accelerator's own, from its fake-host part: ``HostPart.add_verbs``)

DEVICE is a name a user sees (``fake-sysfs show DIR`` lists them). Exit status 0 on success, 2 on bad input; the
message names the device and lists the valid ones.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from accel_core.fakehost.fsops import FakeHostError
from accel_core.fakehost.host import MARKER, FakeHost, removed_phrase
from accel_core.fakehost.parts import part_types


def examples() -> str:
    """Device names of every part, for help texts: ``rdmap79s0 (EFA), neuron3 (Neuron)``."""
    return ", ".join(part.example for part in part_types() if part.example) or "none"


def parser() -> argparse.ArgumentParser:
    return _build()[0]


def _build() -> tuple[argparse.ArgumentParser, argparse._SubParsersAction[argparse.ArgumentParser]]:
    p = argparse.ArgumentParser(
        prog="fake-sysfs", description="Inject a fault into a fake host tree (written by `fake-sysfs "
        f"--instance-type TYPE DIR`) while the daemons run against it. DEVICE is a name the daemons log: "
        f"{examples()}; `fake-sysfs show DIR` lists them.")
    sub = p.add_subparsers(dest="verb", required=True, metavar="VERB")
    for part in part_types():
        part.add_verbs(sub)

    rm = sub.add_parser("remove", help="remove a device as if its driver lost it",
                        description="Remove a device's sysfs entries, PCI function and /dev node (or, with "
                        "--dev-node, only its /dev node). `fake-sysfs restore` puts back exactly what was removed, "
                        "from any later process.")
    dir_and_device(rm)
    rm.add_argument("--dev-node", action="store_true", help="remove only the /dev node; sysfs stays")
    rm.set_defaults(run=_remove)

    back = sub.add_parser("restore", help="put back a removed device (or its /dev node)",
                          description="Put back what `fake-sysfs remove` removed of DEVICE.")
    dir_and_device(back)
    back.set_defaults(run=_restore)

    show = sub.add_parser("show", help="list the devices with their state (port, hw errors, removed)",
                          description="List DIR's devices: kind, /dev node, and state as the health rules see it.")
    show.add_argument("dir", type=Path, metavar="DIR", help="the fake host tree")
    show.set_defaults(run=_show)
    return p, sub


def verb_names() -> tuple[str, ...]:
    """Every verb: the parts' own, then ``remove``, ``restore``, ``show``."""
    return tuple(_build()[1].choices)


def verb_help() -> list[tuple[str, str]]:
    """``(verb, help)`` of every verb, for ``fake-sysfs --help``."""
    return [(action.dest, action.help or "") for action in _build()[1]._choices_actions]


def dir_and_device(p: argparse.ArgumentParser, what: str = "") -> None:
    """A verb's ``DIR DEVICE`` arguments."""
    p.add_argument("dir", type=Path, metavar="DIR", help="the fake host tree (on a rig node: $HOST_ROOT)")
    p.add_argument("device", metavar="DEVICE", help=what or f"e.g. {examples()}")


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


def present(host: FakeHost, device: str) -> None:
    """Refuse a fault on a removed device, naming the way back."""
    gone = host.removed_parts(device)
    if gone:
        raise FakeHostError(f"{removed_phrase(device, gone)}; `fake-sysfs restore {host.root} {device}` first")


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


def names_with(host: FakeHost, method: str) -> str:
    """The host's devices whose part has ``method``, for an error naming the valid ones."""
    names = [name for name, part in host.devices().items() if hasattr(part, method)]
    return f"this {host.instance_type} has: {', '.join(names)}" if names else f"this {host.instance_type} has none"
