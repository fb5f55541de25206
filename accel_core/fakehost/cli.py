"""``fake-sysfs``: write a fake host tree for a catalog instance type, or list the catalog.

    fake-sysfs --instance-type TYPE DIR [--force] [each accelerator's build flags, e.g. --no-efa, --lnc 1|2]
    fake-sysfs --list
    fake-sysfs VERB ...   (fault verbs on a written tree: accel_core/fakehost/verbs.py and the accelerators' parts)

The build flags, the fault verbs and the ``--list`` columns come from the registered accelerators' fake-host parts
(:mod:`accel_core.fakehost.parts`). Exit status 0 on success, 2 on any usage or input error (the message names the
problem).
"""

from __future__ import annotations

import argparse
import sys
import textwrap
from collections.abc import Sequence
from pathlib import Path

from accel_core.awsfacts import catalog
from accel_core.awsfacts.catalog import UnknownInstanceType
from accel_core.fakehost import verbs
from accel_core.fakehost.builder import MANAGED_TOP_LEVEL, build_host, clear_host
from accel_core.fakehost.fsops import FakeHostError
from accel_core.fakehost.parts import cli_options, part_types

EXIT_OK = 0
EXIT_USAGE = 2


def _parser() -> argparse.ArgumentParser:
    verb_help = verbs.verb_help()  # builds the verbs' parser: once
    width = max(len(verb) for verb, _help in verb_help)
    p = argparse.ArgumentParser(
        prog="fake-sysfs",
        description="Generate the /sys, /dev and /proc files of an AWS instance type under DIR "
        "(point the daemons' host root at DIR).",
        epilog="Fault verbs on a tree written earlier (each has --help):\n"
        + "".join(textwrap.fill(text, 100, initial_indent=f"  fake-sysfs {verb.ljust(width)}  ",
                                subsequent_indent=" " * (width + 15)) + "\n" for verb, text in verb_help)
        + "(a DIR named like a verb needs a path prefix: ./show)",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("dir", nargs="?", type=Path, metavar="DIR", help="output directory (created if missing)")
    p.add_argument("--instance-type", "-t", metavar="TYPE", help="a catalog instance type (--list shows them)")
    p.add_argument("--list", action="store_true", help="print the catalog and exit")
    for _part, option in cli_options():
        option.add_to(p)
    p.add_argument("--force", action="store_true", help="replace a tree already in DIR (only what fake-sysfs writes)")
    return p


def format_catalog() -> str:
    """The ``--list`` table: the type, then each accelerator part's columns."""
    header = ("TYPE", *(c for part in part_types() for c in part.columns))
    rows = [header]
    for name in catalog.names():
        t = catalog.get(name)
        rows.append((name, *(cell for part in part_types() for cell in part.row(t))))
    widths = [max(len(r[i]) for r in rows) for i in range(len(header))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows)


def _fail(message: str) -> int:
    print(f"fake-sysfs: error: {message}", file=sys.stderr)
    return EXIT_USAGE


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    names = verbs.verb_names()
    if argv and argv[0] in names:
        return verbs.main(argv, _fail)
    args = _parser().parse_args(argv)
    if args.list:
        print(format_catalog())
        return EXIT_OK
    if args.instance_type is None or args.dir is None:
        return _fail(f"need --instance-type TYPE and DIR, --list, or a fault verb ({', '.join(names)})")
    try:
        spec = catalog.get(args.instance_type)
    except UnknownInstanceType as exc:
        return _fail(str(exc))
    options = {option.option: getattr(args, option.option) for _part, option in cli_options()}
    try:
        for part in part_types():
            part.check(spec, options)
    except FakeHostError as exc:
        return _fail(str(exc))
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
        host = build_host(root, spec.name, **options)
    except (FakeHostError, OSError) as exc:
        return _fail(str(exc))
    print(f"wrote {host.instance_type} to {root}: {', '.join(line for part in host.parts for line in part.summary())}")
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
