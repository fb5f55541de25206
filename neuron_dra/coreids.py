"""The one NeuronCore numbering: ``aws.amazon.com/neuroncore`` IDs, ``NEURON_RT_VISIBLE_CORES`` and the DRA
claim status all number a node's logical NeuronCores as device index × logical cores per device + local core,
where a device has its physical cores divided by the Logical NeuronCore setting (LNC=2 on a Trainium2 chip of 8
physical cores: 4 logical cores, so device 3 holds cores 12-15)."""

from __future__ import annotations


def logical_cores(physical: int, lnc: int | None) -> int:
    """Logical NeuronCores of a device of ``physical`` cores under ``lnc`` (None: no LNC setting); at least 1."""
    return max(1, physical // (lnc or 1))


def core_ids(device: int, per_device: int) -> range:
    """The global logical core IDs of ``device`` (``per_device`` logical cores each)."""
    return range(device * per_device, (device + 1) * per_device)


def core_id(device: int, per_device: int, local: int) -> int:
    """The global ID of logical core ``local`` of ``device``."""
    return device * per_device + local
