"""Generic host facts every accelerator driver needs: the EC2 instance type (DMI) and a PCI function's PCIe root.

Pure reads under the host root; nothing here knows about EFA or Neuron.
"""

from __future__ import annotations

import os

from accel_core.paths import HostPaths

DMI_PRODUCT_NAMES = ("/sys/class/dmi/id/product_name", "/sys/devices/virtual/dmi/id/product_name")
SYS_DEVICES = "/sys/devices"


def read_instance_type(paths: HostPaths) -> str | None:
    """The DMI product name (``p5.48xlarge``), or None when unreadable (not EC2, or no /sys in a container)."""
    for path in DMI_PRODUCT_NAMES:
        try:
            text = paths.host(path).read_text(errors="replace").strip()
        except OSError:
            continue
        if text:
            return text
    return None


def pcie_root(paths: HostPaths, resolved_dir: str) -> str | None:
    """``pci0000:44``: the first component below ``<host>/sys/devices`` of a resolved device directory."""
    prefix = os.path.join(str(paths.host_root).rstrip("/"), SYS_DEVICES.lstrip("/")) + "/"
    if not resolved_dir.startswith(prefix):
        return None
    first = resolved_dir[len(prefix):].split("/", 1)[0]
    return first if first.startswith("pci") else None
