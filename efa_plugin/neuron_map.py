"""Which Neuron devices each EFA serves on Trainium instances (the aws-neuron EFA mapping tables, as data).

On Trainium the PCIe root is not a good affinity key (the mapping library says so), so the plugin looks the EFA's
PCI address up in a per-platform table: Neuron device index -> EFA bus/device. Facts from neuron.md section 3.
The instance type comes from the DMI ``product_name``. Types not listed here get no Neuron proximity.
"""

from __future__ import annotations

from collections.abc import Mapping

# Neuron device index -> EFA "bus:slot.fn" (PCI domain 0000), per platform table.
_TRN1 = ("10:1a.0", "10:1a.0", "a0:1a.0", "a0:1a.0", "20:19.0", "20:19.0", "90:19.0", "90:19.0",
         "20:1a.0", "20:1a.0", "90:1a.0", "90:1a.0", "10:19.0", "10:19.0", "a0:19.0", "a0:19.0")
_TRN1N = ("10:17.0", "10:1a.0", "a0:17.0", "a0:1a.0", "20:19.0", "20:18.0", "90:19.0", "90:18.0",
          "20:17.0", "20:1a.0", "90:17.0", "90:1a.0", "10:19.0", "10:18.0", "a0:19.0", "a0:18.0")
_TRN2 = tuple(f"{bus}:00.0" for bus in ("c9", "b4", "b3", "ca", "6c", "57", "56", "6d",
                                        "98", "83", "82", "99", "f5", "e0", "df", "f6"))
_TRN3 = tuple(f"{bus}:00.0" for bus in ("be", "a9", "a8", "bf", "61", "4c", "4b", "62",
                                        "8d", "78", "77", "8e", "ea", "d5", "d4", "eb"))

#: instance family -> table; only the large sizes the mapping library lists carry EFA in this layout.
_FAMILY_TABLES: Mapping[str, tuple[str, ...]] = {
    "trn1": _TRN1,
    "trn1n": _TRN1N,
    "trn2": _TRN2,
    "trn2e": _TRN2,
    "trn2u": _TRN2,
    "trn3": _TRN3,
    "trn3p": _TRN3,
    "trn3pd98": _TRN3,
    "trn3s": _TRN3,
}
_SIZES = ("32xlarge", "48xlarge")


def neuron_table(instance_type: str | None) -> dict[str, tuple[int, ...]]:
    """EFA PCI address (``0000:10:1a.0``) -> Neuron device indices it serves; {} for types without a table."""
    if not instance_type or "." not in instance_type:
        return {}
    family, size = instance_type.strip().split(".", 1)
    table = _FAMILY_TABLES.get(family)
    if table is None or size not in _SIZES:
        return {}
    out: dict[str, list[int]] = {}
    for index, bdf in enumerate(table):
        out.setdefault(f"0000:{bdf}", []).append(index)
    return {bdf: tuple(indices) for bdf, indices in out.items()}
