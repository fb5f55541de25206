"""Generic host facts every accelerator driver needs: the EC2 instance type (DMI) and a PCI function's PCIe root.

Pure reads under the host root; nothing here knows about EFA or Neuron.
"""

from __future__ import annotations

import os
import re

from accel_core.hostfiles import HostValueError, describe, is_missing, read_attr
from accel_core.paths import HostPaths

DMI_PRODUCT_NAMES = ("/sys/class/dmi/id/product_name", "/sys/devices/virtual/dmi/id/product_name")
SYS_DEVICES = "/sys/devices"
#: longer than any EC2 instance type, and the limit of a ResourceSlice string attribute
MAX_INSTANCE_TYPE = 64
_PCIE_ROOT_RE = re.compile(r"pci[0-9a-f]{4}:[0-9a-f]{2}", re.ASCII)


def read_instance_type(paths: HostPaths, problems: list[str] | None = None) -> str | None:
    """The DMI product name (``p5.48xlarge``), or None when unreadable (not EC2, or no /sys in a container).

    A value that cannot be an instance type (not printable ASCII, longer than 64 characters) counts as
    unreadable; why is appended to ``problems`` (naming the file) when given. A missing file is not a problem.
    """
    for path in DMI_PRODUCT_NAMES:
        try:
            text = read_attr(str(paths.host(path)), path)
        except HostValueError as exc:
            if problems is not None and not is_missing(exc):
                problems.append(str(exc))
            continue
        if not text:
            continue
        if len(text) > MAX_INSTANCE_TYPE or not text.isascii() or not text.isprintable():
            if problems is not None:
                problems.append(f"{path}: not an instance type ({describe(text)})")
            continue
        return text
    return None


def pcie_root(paths: HostPaths, resolved_dir: str) -> str | None:
    """``pci0000:44``: the first component below ``<host>/sys/devices`` of a resolved device directory."""
    prefix = os.path.join(str(paths.host_root).rstrip("/"), SYS_DEVICES.lstrip("/")) + "/"
    if not resolved_dir.startswith(prefix):
        return None
    first = resolved_dir[len(prefix):].split("/", 1)[0]
    return first if _PCIE_ROOT_RE.fullmatch(first) else None
