"""What a container gets: device nodes, env, mounts, annotations.

One small type shared by device-plugin Allocate and DRA prepare (where it becomes a CDI spec).
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class DeviceNode:
    """A device node to expose; ``host_path`` defaults to ``path``."""

    path: str
    host_path: str | None = None
    permissions: str = "rw"
    major: int | None = None
    minor: int | None = None


@dataclass(frozen=True)
class Mount:
    host_path: str
    container_path: str
    read_only: bool = True


@dataclass(frozen=True)
class ContainerEdits:
    """Edits for one container (or one CDI device)."""

    device_nodes: tuple[DeviceNode, ...] = ()
    env: tuple[tuple[str, str], ...] = ()
    mounts: tuple[Mount, ...] = ()
    annotations: tuple[tuple[str, str], ...] = field(default=())

    def env_dict(self) -> dict[str, str]:
        return dict(self.env)

    def merged(self, other: ContainerEdits) -> ContainerEdits:
        """Union of two edit sets; ``other`` wins on env/annotation keys; device nodes de-duplicated by path."""
        nodes = {n.path: n for n in self.device_nodes}
        nodes.update({n.path: n for n in other.device_nodes})
        env = dict(self.env)
        env.update(other.env)
        ann = dict(self.annotations)
        ann.update(other.annotations)
        mounts = {m.container_path: m for m in self.mounts}
        mounts.update({m.container_path: m for m in other.mounts})
        return ContainerEdits(
            device_nodes=tuple(nodes.values()),
            env=tuple(env.items()),
            mounts=tuple(mounts.values()),
            annotations=tuple(ann.items()),
        )
