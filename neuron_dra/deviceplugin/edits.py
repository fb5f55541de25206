"""Container edits for an Allocate: ``/dev/neuronN`` nodes plus the runtime env (see neuron_dra.runtime_env)."""

from __future__ import annotations

from collections.abc import Sequence
from functools import lru_cache

from accel_core.edits import ContainerEdits, DeviceNode
from neuron_dra.runtime_env import LNC_ENV, VISIBLE_CORES_ENV, CoreNumbering, format_core_list, visible_cores

__all__ = ["CoreNumbering", "container_edits", "format_core_list", "visible_cores"]


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
    nodes = tuple(DeviceNode(f"/dev/neuron{d}", host_path=f"/dev/neuron{d}", permissions="rw")
                  for d in sorted(set(devices)))
    env: list[tuple[str, str]] = [(VISIBLE_CORES_ENV, format_core_list(visible_cores(cores, cores_per_device,
                                                                                        numbering)))]
    if lnc is not None:
        env.append((LNC_ENV, str(lnc)))
    return ContainerEdits(device_nodes=nodes, env=tuple(env))
