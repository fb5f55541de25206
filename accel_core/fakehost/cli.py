"""``fake-sysfs``: write a fake host tree for a catalog instance type, or list the catalog.

    fake-sysfs --instance-type trn2.48xlarge DIR [--no-efa] [--lnc 1|2] [--force]
    fake-sysfs --instance-type trn2u.48xlarge --ultraserver ID --ultraserver-node K DIR   (K in 0..3)
    fake-sysfs --list
    fake-sysfs port|neuron-error|remove|restore|show ...   (fault verbs on a written tree: accel_core/fakehost/verbs.py)

Exit status 0 on success, 2 on any usage or input error (the message names the problem).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from accel_core.awsfacts import catalog
from accel_core.awsfacts.catalog import InstanceType, UnknownInstanceType
from accel_core.fakehost import verbs
from accel_core.fakehost.builder import MANAGED_TOP_LEVEL, build_host, clear_host
from accel_core.fakehost.fsops import FakeHostError

EXIT_OK = 0
EXIT_USAGE = 2


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="fake-sysfs",
        description="Generate the /sys, /dev and /proc files of an AWS instance type under DIR "
        "(point the daemons' host root at DIR).",
        epilog="Fault verbs on a tree written earlier (each has --help):\n"
        "  fake-sysfs port DIR DEVICE down|up [--port N]      EFA/RDMA port state\n"
        "  fake-sysfs neuron-error DIR neuronN [--count N]    uncorrected ECC errors (--clear: back to 0)\n"
        "  fake-sysfs remove DIR DEVICE [--dev-node]          device gone (or only its /dev node)\n"
        "  fake-sysfs restore DIR DEVICE                      put it back\n"
        "  fake-sysfs show DIR                                devices and their state\n"
        "(a DIR named like a verb needs a path prefix: ./port)",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("dir", nargs="?", type=Path, metavar="DIR", help="output directory (created if missing)")
    p.add_argument("--instance-type", "-t", metavar="TYPE", help="catalog instance type, e.g. p5.48xlarge")
    p.add_argument("--list", action="store_true", help="print the catalog and exit")
    p.add_argument("--no-efa", action="store_true", help="build the type with no EFA attached")
    p.add_argument("--lnc", type=int, choices=(1, 2), help="write /opt/aws/neuron/logical_nc_config (trn2 only)")
    p.add_argument("--ultraserver", metavar="ID",
                   help="make the node part of the 4-node UltraServer ID (trn2u.48xlarge; needs --ultraserver-node)")
    p.add_argument("--ultraserver-node", type=int, choices=range(4), metavar="K",
                   help="this node's number (0..3) in the UltraServer")
    p.add_argument("--force", action="store_true", help="replace a tree already in DIR (only what fake-sysfs writes)")
    return p


def _neuron_cell(t: InstanceType) -> str:
    return f"{t.neuron_count}x{t.cores_per_device}" if t.neuron_count else "-"


def format_catalog() -> str:
    """The ``--list`` table: type, EFA count, non-EFA RDMA, Neuron devices x cores, GPUs."""
    header = ("TYPE", "EFA", "OTHER-RDMA", "NEURON", "LNC", "GPUS")
    rows = [header]
    for name in catalog.names():
        t = catalog.get(name)
        lnc = str(t.neuron.lnc_default) if t.neuron and t.neuron.lnc_default else "-"
        rows.append((name, str(t.efa_count), str(len(t.other_rdma)), _neuron_cell(t), lnc, str(t.gpu_count)))
    widths = [max(len(r[i]) for r in rows) for i in range(len(header))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows)


def _fail(message: str) -> int:
    print(f"fake-sysfs: error: {message}", file=sys.stderr)
    return EXIT_USAGE


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] in verbs.VERBS:
        return verbs.main(argv, _fail)
    args = _parser().parse_args(argv)
    if args.list:
        print(format_catalog())
        return EXIT_OK
    if args.instance_type is None or args.dir is None:
        return _fail(f"need --instance-type TYPE and DIR, --list, or a fault verb ({', '.join(verbs.VERBS)})")
    try:
        spec = catalog.get(args.instance_type)
    except UnknownInstanceType as exc:
        return _fail(str(exc))
    if (args.ultraserver is None) != (args.ultraserver_node is None):
        return _fail("--ultraserver ID and --ultraserver-node K go together")
    if args.ultraserver is not None and not (spec.neuron and spec.neuron.ultraserver):
        return _fail(f"instance type {spec.name} is not an UltraServer node type; --ultraserver is not allowed")
    if args.lnc is not None and not spec.supports_lnc:
        return _fail(f"instance type {spec.name} has no Logical NeuronCore setting; --lnc is not allowed")
    root: Path = args.dir
    if root.exists() and not root.is_dir():
        return _fail(f"{root} exists and is not a directory")
    if root.is_dir() and any(root.iterdir()):
        if not args.force:
            return _fail(f"{root} is not empty; pass --force to replace the host tree in it")
        foreign = sorted(p.name for p in root.iterdir() if p.name not in MANAGED_TOP_LEVEL)
        if foreign:
            return _fail(f"{root} holds files fake-sysfs did not write ({', '.join(foreign[:5])}); refusing --force")
    try:
        if args.force:
            clear_host(root)
        host = build_host(root, spec.name, efa=not args.no_efa, lnc=args.lnc, ultraserver_id=args.ultraserver,
                          ultraserver_node=args.ultraserver_node)
    except (FakeHostError, OSError) as exc:
        return _fail(str(exc))
    print(
        f"wrote {host.instance_type} to {root}: {len(host.efa_ibdevs)} EFA, "
        f"{len(host.rdma_ibdevs) - len(host.efa_ibdevs)} other RDMA, {_neuron_cell(spec)} Neuron, "
        f"{spec.gpu_count} GPU"
        + (f", UltraServer {args.ultraserver} node {args.ultraserver_node}" if args.ultraserver is not None else "")
    )
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
