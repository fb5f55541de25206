"""Generate a host tree (``/sys``, ``/dev``, ``/proc``, ``/opt``) for a catalog instance type under a root.

``build_host(root, "trn2.48xlarge")`` writes what every instance has (DMI, boot id), then runs each
registered accelerator's part (:mod:`accel_core.fakehost.parts`, named by its declaration in
:mod:`accel_core.registry`), then returns a :class:`~accel_core.fakehost.host.FakeHost` for mutations.
Layout: docs/fake-sysfs.md.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import uuid
from pathlib import Path
from typing import Any

from accel_core.awsfacts import catalog
from accel_core.fakehost.fsops import FakeHostError
from accel_core.fakehost.host import MARKER, REMOVED_RECORD, FakeHost
from accel_core.fakehost.parts import Writer, part_types

#: Top-level entries the builder owns; ``clear_host`` removes exactly these.
MANAGED_TOP_LEVEL = ("sys", "dev", "proc", "opt", MARKER, REMOVED_RECORD)


def default_boot_id(instance_type: str) -> str:
    """A fixed UUID per instance type (the same type always gets the same boot id)."""
    return str(uuid.uuid5(uuid.NAMESPACE_URL, f"fake-sysfs:{instance_type}"))


def build_host(root: Path, instance_type: str, **options: Any) -> FakeHost:
    """Write the host tree of ``instance_type`` under ``root`` and return a handle for mutations.

    ``options`` go to the parts that declare them (each part's ``options``; ``fake-sysfs --help`` lists them as
    flags). Raises
    :class:`~accel_core.awsfacts.catalog.UnknownInstanceType` or :class:`FakeHostError`.
    """
    spec = catalog.get(instance_type)
    known = {name for part in part_types() for name in part.options}
    unknown = sorted(set(options) - known)
    if unknown:
        raise FakeHostError(f"unknown fake-host option(s) {', '.join(unknown)} (known: {', '.join(sorted(known))})")
    for part in part_types():
        part.check(spec, options)
    root = Path(root)
    existing = [name for name in MANAGED_TOP_LEVEL if (root / name).exists() or (root / name).is_symlink()]
    if existing:
        raise FakeHostError(f"{root} already holds a host tree ({', '.join(existing)}); clear it first")
    root.mkdir(parents=True, exist_ok=True)
    w = Writer(root)
    asset = hashlib.sha256(f"{spec.name}/instance".encode()).hexdigest()[:17]
    w.files("sys/devices/virtual/dmi/id", {"product_name": f"{spec.name}\n", "sys_vendor": "Amazon EC2\n",
                                           "board_asset_tag": f"i-{asset}\n"})
    w.link("sys/class/dmi/id", "sys/devices/virtual/dmi/id")
    w.file("proc/sys/kernel/random/boot_id", f"{default_boot_id(spec.name)}\n")
    host = FakeHost(root, spec, options)
    for each in host.parts:
        each.write(w)
    w.file(MARKER, json.dumps({"instance_type": spec.name, **{k: v for k, v in options.items()}}) + "\n")
    return host


def clear_host(root: Path) -> None:
    """Remove what :func:`build_host` wrote under ``root`` (only its top-level entries; nothing else)."""
    root = Path(root)
    if root.resolve() == Path("/"):
        raise FakeHostError("refusing to clear the real root /")
    for name in MANAGED_TOP_LEVEL:
        path = root / name
        if path.is_symlink() or path.is_file():
            path.unlink()
        elif path.is_dir():
            shutil.rmtree(path)
