"""The Neuron runtime environment of a container: ``NEURON_RT_VISIBLE_CORES`` and ``NEURON_LOGICAL_NC_CONFIG``.

Shared by the device plugin (Allocate) and the DRA driver (CDI specs) through :mod:`neuron_dra.edits`, so both
number cores the same way, and both take ``--core-numbering`` (:data:`CORE_NUMBERING_FLAG`).

Core numbering (``container``, the default): the Neuron runtime inside a container (runtime 2.16+ with driver
2.12.14+) enumerates only the ``/dev/neuronN`` nodes the container has, in ascending N, and numbers their
NeuronCores from 0: the k-th visible device (k from 0) owns cores ``k*C .. k*C+C-1``, C = logical cores per
device. So host core 18 on trn2 LNC 2 (device 4, local core 2) in a container that got only ``/dev/neuron4`` is
core ``2`` there; naming it ``18`` would point the runtime at a core that does not exist in the container.
``host`` numbering (global host indices) is kept for runtimes older than 2.16, which numbered by host device.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Literal

from accel_core.cli import env_choice

VISIBLE_CORES_ENV = "NEURON_RT_VISIBLE_CORES"
LNC_ENV = "NEURON_LOGICAL_NC_CONFIG"
CoreNumbering = Literal["container", "host"]
#: ``--core-numbering``: the Neuron device plugin and the Neuron DRA driver take the same flag, env and default.
CORE_NUMBERING_FLAG = env_choice("--core-numbering", "NEURON_CORE_NUMBERING", ("container", "host"), "container",
                                 "NEURON_RT_VISIBLE_CORES numbering: container-relative (runtime 2.16+) or host")


def format_core_list(cores: Iterable[int]) -> str:
    """``[0, 1, 2, 3, 6, 8, 9]`` -> ``"0-3,6,8-9"`` (ranges and comma lists are both runtime syntax)."""
    values = sorted(set(cores))
    parts: list[str] = []
    i = 0
    while i < len(values):
        j = i
        while j + 1 < len(values) and values[j + 1] == values[j] + 1:
            j += 1
        parts.append(str(values[i]) if i == j else f"{values[i]}-{values[j]}")
        i = j + 1
    return ",".join(parts)


def visible_cores(
    cores: Sequence[int], cores_per_device: int, numbering: CoreNumbering = "container"
) -> list[int]:
    """Global host core indices -> the indices the runtime in the container uses (see the module docstring)."""
    if numbering == "host":
        return sorted(set(cores))
    devices = sorted({c // cores_per_device for c in cores})
    rank = {dev: k for k, dev in enumerate(devices)}
    return sorted(rank[c // cores_per_device] * cores_per_device + c % cores_per_device for c in cores)
