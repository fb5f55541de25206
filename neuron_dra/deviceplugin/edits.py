"""Container edits for an Allocate: ``/dev/neuronN`` nodes plus the runtime env (see neuron_dra.runtime_env)."""

from __future__ import annotations

from collections.abc import Sequence

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
    """Edits for a container that gets ``devices`` (whole ``/dev`` nodes) and may use ``cores`` (global ids)."""
    nodes = tuple(DeviceNode(f"/dev/neuron{d}", host_path=f"/dev/neuron{d}", permissions="rw")
                  for d in sorted(set(devices)))
    env: list[tuple[str, str]] = [(VISIBLE_CORES_ENV, format_core_list(visible_cores(cores, cores_per_device,
                                                                                        numbering)))]
    if lnc is not None:
        env.append((LNC_ENV, str(lnc)))
    return ContainerEdits(device_nodes=nodes, env=tuple(env))
