"""The one builder of Neuron container edits, for Allocate (device plugin) and for CDI (DRA driver): the
``/dev/neuronN`` nodes and the runtime env, numbered by ``--core-numbering`` on both paths
(see :mod:`neuron_dra.runtime_env`)."""

from __future__ import annotations

from collections.abc import Sequence
from functools import lru_cache

from accel_core.edits import ContainerEdits, DeviceNode
from neuron_dra.runtime_env import (
    CORE_NUMBERING_FLAG,
    LNC_ENV,
    VISIBLE_CORES_ENV,
    CoreNumbering,
    format_core_list,
    visible_cores,
)

__all__ = ["CORE_NUMBERING_FLAG", "CoreNumbering", "container_edits", "device_node", "format_core_list",
           "runtime_env", "visible_cores"]


def device_node(index: int) -> DeviceNode:
    """``/dev/neuron<index>``, read-write, the same path in the container as on the host."""
    return DeviceNode(f"/dev/neuron{index}", host_path=f"/dev/neuron{index}", permissions="rw")


def runtime_env(cores: Sequence[int], *, cores_per_device: int, lnc: int | None,
                numbering: CoreNumbering = "container") -> tuple[tuple[str, str], ...]:
    """``NEURON_RT_VISIBLE_CORES`` for ``cores`` (global host indices, ``cores_per_device`` logical cores per
    device), numbered as ``numbering`` says, and ``NEURON_LOGICAL_NC_CONFIG`` when ``lnc`` is set."""
    env = [(VISIBLE_CORES_ENV, format_core_list(visible_cores(cores, cores_per_device, numbering)))]
    if lnc is not None:
        env.append((LNC_ENV, str(lnc)))
    return tuple(env)


def container_edits(
    devices: Sequence[int],
    cores: Sequence[int],
    *,
    cores_per_device: int,
    lnc: int | None,
    numbering: CoreNumbering = "container",
) -> ContainerEdits:
    """Edits for a container that gets ``devices`` (whole ``/dev`` nodes) and may use ``cores`` (global ids).

    Built once per distinct device/core set and reused (the edits are immutable), so Allocate does no formatting.
    """
    return _edits(tuple(devices), tuple(cores), cores_per_device, lnc, numbering)


@lru_cache(maxsize=4096)
def _edits(devices: tuple[int, ...], cores: tuple[int, ...], cores_per_device: int, lnc: int | None,
           numbering: CoreNumbering) -> ContainerEdits:
    return ContainerEdits(device_nodes=tuple(device_node(d) for d in sorted(set(devices))),
                          env=runtime_env(cores, cores_per_device=cores_per_device, lnc=lnc, numbering=numbering))
