"""EFA-proximity device group ids (``resource.aws.com/devicegroup{1,4,8,16}_id``) for Neuron devices and EFAs.

These ids let a claim pair Neuron devices with the EFA interfaces next to them through a cross-driver
``matchAttribute`` constraint, so they must equal what every other publisher (the AWS EFA mapping library, used by
the Neuron DRA driver and by DRANET for EFA devices) computes. Both of our DRA drivers (``neuron.aws.com`` on
Neuron devices, ``efa.aws.com`` on EFA devices) and the EFA device plugin read them from here, as does the fake
host's instance catalog. The rule, as that library defines it:

- only instance types in :data:`EFA_ENABLED_INSTANCE_TYPES` get ids; the table is chosen by the part of the type
  before the first ``.`` through :data:`TABLE_OF_FAMILY`;
- ``devicegroup1_id`` is the EFA PCI address (BDF) mapped to the Neuron device, verbatim;
- ``devicegroupN_id`` (N = 4, 8, 16) hashes the group ``[d // N * N, d // N * N + N)``: collect the EFA BDFs of
  the group's devices that are in the table, drop duplicates, sort, join with ``,``, SHA-256, first 16 hex digits;
- a device id missing from the table gets no ids at all.

The tables below are facts (Neuron device index -> EFA BDF), one per hardware family.
"""

from __future__ import annotations

import hashlib

ATTRIBUTE_DOMAIN = "resource.aws.com"
GROUP_SIZES = (1, 4, 8, 16)


def attribute_name(size: int) -> str:
    """``resource.aws.com/devicegroup<size>_id``."""
    return f"{ATTRIBUTE_DOMAIN}/devicegroup{size}_id"


DEVICEGROUP1_ID = attribute_name(1)
DEVICEGROUP4_ID = attribute_name(4)
DEVICEGROUP8_ID = attribute_name(8)
DEVICEGROUP16_ID = attribute_name(16)

EFA_ENABLED_INSTANCE_TYPES = frozenset({
    "trn1.32xlarge", "trn1n.32xlarge",
    "trn2.48xlarge", "trn2e.48xlarge", "trn2u.48xlarge",
    "trn3.48xlarge", "trn3p.48xlarge", "trn3pd98.48xlarge", "trn3s.48xlarge",
    "trn3-dev0.48xlarge", "trn3-dev1.48xlarge",
})

#: Instance family (the type before the first ``.``) -> name of its Neuron-to-EFA table.
TABLE_OF_FAMILY = {
    "trn1": "trn1", "trn1n": "trn1n",
    "trn2": "trn2", "trn2e": "trn2", "trn2u": "trn2",
    "trn3": "trn3", "trn3p": "trn3", "trn3pd98": "trn3", "trn3s": "trn3",
    "trn3-dev0": "trn3pds", "trn3-dev1": "trn3pds",
}


def _bus_table(buses: str, slot: str = "00.0") -> tuple[str, ...]:
    """Expand ``"c9 b4 ..."`` (one PCI bus per Neuron device, in index order) to BDFs on domain 0000."""
    return tuple(f"0000:{bus}:{slot}" for bus in buses.split())


#: Table name -> EFA BDF of Neuron device 0, 1, 2, ...
NEURON_TO_EFA: dict[str, tuple[str, ...]] = {
    # trn1: eight EFAs, two Neuron devices per EFA.
    "trn1": tuple(f"0000:{x}" for x in (
        "10:1a.0", "10:1a.0", "a0:1a.0", "a0:1a.0", "20:19.0", "20:19.0", "90:19.0", "90:19.0",
        "20:1a.0", "20:1a.0", "90:1a.0", "90:1a.0", "10:19.0", "10:19.0", "a0:19.0", "a0:19.0",
    )),
    "trn1n": tuple(f"0000:{x}" for x in (
        "10:17.0", "10:1a.0", "a0:17.0", "a0:1a.0", "20:19.0", "20:18.0", "90:19.0", "90:18.0",
        "20:17.0", "20:1a.0", "90:17.0", "90:1a.0", "10:19.0", "10:18.0", "a0:19.0", "a0:18.0",
    )),
    "trn2": _bus_table("c9 b4 b3 ca 6c 57 56 6d 98 83 82 99 f5 e0 df f6"),
    "trn3": _bus_table("be a9 a8 bf 61 4c 4b 62 8d 78 77 8e ea d5 d4 eb"),
    "trn3pds": _bus_table("a9 a8 bf be d5 d4 eb ea 4c 4b 62 61 78 77 8e 8d"),
}


def efa_table(instance_type: str) -> tuple[str, ...] | None:
    """The Neuron-index -> EFA BDF table for an instance type, or None when the type is not EFA-enabled."""
    if instance_type not in EFA_ENABLED_INSTANCE_TYPES:
        return None
    table = TABLE_OF_FAMILY.get(instance_type.split(".", 1)[0])
    return NEURON_TO_EFA.get(table) if table else None


def group_hash(efa_bdfs: list[str] | tuple[str, ...]) -> str:
    """First 16 hex digits of SHA-256 over the sorted, de-duplicated BDFs joined with ``,``."""
    joined = ",".join(sorted(set(efa_bdfs)))
    return hashlib.sha256(joined.encode()).hexdigest()[:16]


def _group_members(table: tuple[str, ...], index: int, size: int) -> list[str]:
    start = index // size * size
    return [table[i] for i in range(start, start + size) if i < len(table)]


def neuron_device_group_ids(instance_type: str, index: int) -> dict[str, str]:
    """The devicegroup attributes of Neuron device ``index`` (empty for non-EFA types and unknown indices)."""
    table = efa_table(instance_type)
    if table is None or not 0 <= index < len(table):
        return {}
    ids = {DEVICEGROUP1_ID: table[index]}
    for size in GROUP_SIZES[1:]:
        ids[attribute_name(size)] = group_hash(_group_members(table, index, size))
    return ids


def efa_device_group_ids(instance_type: str, efa_bdf: str) -> dict[str, str]:
    """The devicegroup attributes of an EFA device, by its BDF: those of the Neuron device it maps to.

    On trn1 two Neuron devices share one EFA; the library keeps the last one its table load saw, which for
    these tables always lies in the same 4-, 8- and 16-device groups as the first, so the ids agree.
    """
    table = efa_table(instance_type)
    if table is None:
        return {}
    bdf = efa_bdf.lower()
    indices = [i for i, b in enumerate(table) if b == bdf]
    return neuron_device_group_ids(instance_type, indices[-1]) if indices else {}
