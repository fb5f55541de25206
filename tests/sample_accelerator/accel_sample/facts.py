"""The sample's catalog section (its facts): types with a ``sacc:`` section get its devices on a fake host."""

from __future__ import annotations

from typing import Annotated

import msgspec


class SaccSection(msgspec.Struct, forbid_unknown_fields=True):
    """``sacc:`` in a catalog type: how many devices, over how many NUMA nodes, their major number."""

    devices: Annotated[int, msgspec.Meta(ge=1, le=64)]
    major: int
    model: str
    numa_nodes: int = 1
