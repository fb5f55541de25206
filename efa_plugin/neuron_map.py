"""Which Neuron devices each EFA serves on Trainium instances.

On Trainium the PCIe root is not a good affinity key, so the plugin looks the EFA's PCI address up in the AWS
Neuron-to-EFA mapping tables. Those tables live once, in :mod:`accel_core.awsfacts.neuron_efa` (both DRA drivers
compute their ``devicegroup*_id`` attributes from the same data); this module only inverts them. The instance type comes
from the DMI ``product_name``; types without a table get no Neuron proximity.
"""

from __future__ import annotations

from accel_core.awsfacts.neuron_efa import efa_table


def neuron_table(instance_type: str | None) -> dict[str, tuple[int, ...]]:
    """EFA PCI address (``0000:10:1a.0``) -> Neuron device indices it serves; {} for types without a table."""
    table = efa_table(instance_type.strip()) if instance_type else None
    if table is None:
        return {}
    out: dict[str, list[int]] = {}
    for index, bdf in enumerate(table):
        out.setdefault(bdf, []).append(index)
    return {bdf: tuple(indices) for bdf, indices in out.items()}
