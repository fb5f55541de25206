"""Where a PCI function of a catalog instance type lives in the generated tree (paths relative to the host root).

Each accelerator's part (:mod:`accel_core.fakehost.parts`) keeps its own devices' paths, which its writer writes
and its mutations remove and restore, so both agree by construction. See docs/fake-sysfs.md.
"""

from __future__ import annotations

from accel_core.awsfacts.catalog import PciFunction


def pci_dir(fn: PciFunction) -> str:
    """``sys/devices/pci0000:XX/[0000:XX:01.0/]<bdf>``: directly on the root bus or behind one bridge."""
    base = f"sys/devices/{fn.root}"
    if fn.bus == fn.root_bus:
        return f"{base}/{fn.bdf}"
    return f"{base}/{bridge_bdf(fn)}/{fn.bdf}"


def bridge_bdf(fn: PciFunction) -> str:
    """The single bridge placed between a root and the devices on other buses (its ``01.0`` function)."""
    return f"{fn.bdf[:4]}:{fn.root_bus:02x}:01.0"
