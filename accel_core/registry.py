"""Accelerators register themselves: one :class:`Accelerator` declaration per package, found through the Python
entry points of group ``aws_accel_agents.accelerators`` (``[project.entry-points]`` in a pyproject.toml).

Entry points, not a list in the core: the installed metadata is where Python already keeps console scripts, so an
accelerator in its own distribution (tests/sample_accelerator) registers without editing any core file, and the image
holds exactly the accelerators installed into it. A declaration names, as ``module:attribute`` strings loaded only
when asked for, its catalog sections and extra catalog file, its fake-host writer (dev-only), and its daemons with
their console scripts and ports. :func:`accelerators` refuses two daemons on one metrics or health port, or two
accelerators claiming one catalog section.
"""

from __future__ import annotations

import dataclasses
import importlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cache
from typing import Any

GROUP = "aws_accel_agents.accelerators"


class RegistryError(ValueError):
    """A declaration is malformed or collides with another; the message names both."""


@dataclass(frozen=True)
class Daemon:
    """One console script of an accelerator and the ports it serves by default (0 or None: none)."""

    script: str
    """The console-script name, e.g. ``efa-device-plugin``."""
    target: str
    """Its ``module:function``, as in ``[project.scripts]``."""
    metrics_port: int
    health_port: int | None = None
    read_only: tuple[str, ...] = ()
    """A command that only reads the host (``ls``, ``slices --node-name n1``), run by the image tests."""
    on_node: bool = True
    """A node daemon (host network, shares the node's ports); False for a Deployment in the pod network."""


@dataclass(frozen=True)
class Accelerator:
    """Everything one accelerator package contributes."""

    name: str
    packages: tuple[str, ...]
    """Its top-level import packages (layering and image checks)."""
    daemons: tuple[Daemon, ...] = ()
    catalog_sections: Mapping[str, str] = field(default_factory=dict)
    """Catalog section key -> ``module:Struct`` that decodes it (a msgspec Struct)."""
    catalog_file: str | None = None
    """``package:file.yaml``: extra instance types, in the format of ``accel_core/awsfacts/instances.yaml``."""
    fakehost: str | None = None
    """``module:attribute`` of its fake-host writer (:class:`accel_core.fakehost.parts.HostPart` subclass)."""
    distribution: str = ""
    """The installed distribution that declares it (filled in by :func:`accelerators`)."""

    @property
    def scripts(self) -> dict[str, str]:
        return {d.script: d.target for d in self.daemons}


def load_ref(ref: str) -> Any:
    """The object a ``module:attribute`` string names."""
    module, sep, attr = ref.partition(":")
    if not sep or not module or not attr:
        raise RegistryError(f"{ref!r} is not 'module:attribute'")
    obj: Any = importlib.import_module(module)
    for part in attr.split("."):
        obj = getattr(obj, part)
    return obj


def check(accels: tuple[Accelerator, ...]) -> None:
    """Refuse duplicate names, scripts, node ports and catalog sections, naming both owners."""
    owners: dict[tuple[str, object], str] = {}

    def claim(kind: str, value: object, owner: str) -> None:
        other = owners.setdefault((kind, value), owner)
        if other != owner:
            raise RegistryError(f"{kind} {value} is claimed by both {other} and {owner}")

    for acc in accels:
        claim("accelerator", acc.name, f"entry point {acc.name}")
        for d in acc.daemons:
            claim("console script", d.script, f"{acc.name}/{d.script}")
            ports = [("metrics", d.metrics_port), ("health", d.health_port)] if d.on_node else []
            for what, port in ports:
                if port:
                    claim("port", port, f"{acc.name}/{d.script} ({what})")
        for key in acc.catalog_sections:
            claim("catalog section", repr(key), acc.name)


@cache
def accelerators() -> tuple[Accelerator, ...]:
    """Every registered accelerator, by entry-point name; :class:`RegistryError` for a collision."""
    from importlib.metadata import entry_points  # here: the daemons' start-up imports this module

    found = []
    for ep in sorted(entry_points(group=GROUP), key=lambda e: e.name):
        try:
            acc = ep.load()
        except Exception as exc:  # an accelerator that cannot be imported: one line naming it
            raise RegistryError(f"entry point {ep.name} ({ep.value}) of {GROUP} cannot be loaded: {exc}") from exc
        if not isinstance(acc, Accelerator):
            raise RegistryError(f"entry point {ep.name} ({ep.value}) is not an Accelerator declaration")
        found.append(dataclasses.replace(acc, distribution=ep.dist.name if ep.dist is not None else ""))
    out = tuple(found)
    check(out)
    return out


def daemons() -> tuple[Daemon, ...]:
    return tuple(d for acc in accelerators() for d in acc.daemons)


def daemon(script: str) -> Daemon:
    """The declaration of one console script; KeyError names the known ones."""
    for d in daemons():
        if d.script == script:
            return d
    raise KeyError(f"no accelerator declares the console script {script!r} "
                   f"(declared: {', '.join(d.script for d in daemons())})")
