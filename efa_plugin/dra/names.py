"""The EFA DRA driver's device names (shared with the EFA host scanner, which maps them to device-plugin IDs)."""

from __future__ import annotations

from efa_plugin.discovery import EfaDevice


def device_name(dev: EfaDevice) -> str:
    """``efa-0000-4f-00-0``; the ibdev name for a device without a PCI address."""
    base = dev.pci_address if dev.pci_address else dev.ibdev
    return "efa-" + "".join(c if c.isalnum() else "-" for c in base.lower())[:59].strip("-")
