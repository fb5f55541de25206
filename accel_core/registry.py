"""Accelerators register themselves: one :class:`Accelerator` declaration per package, found through the Python
entry points of group ``aws_accel_agents.accelerators`` (``[project.entry-points]`` in a pyproject.toml).

Entry points, not a list in the core: the installed metadata is where Python already keeps console scripts, so an
accelerator in its own distribution (tests/sample_accelerator) registers without editing any core file, and the image
holds exactly the accelerators installed into it. A declaration names, as ``module:attribute`` strings loaded only
when asked for, its catalog sections and catalog file, its fake-host part (dev-only), and its daemons with
their console scripts and ports. :func:`check` refuses two declarations claiming one name, console script, node
port (metrics or health) or catalog section, naming both.

Failures stay with their package. Each entry point is loaded on its own, and whatever its import raises (an
ImportError, ``sys.exit(0)``, a bare BaseException), a value that is no declaration, or a claim another already
holds leaves that one package out with one logged line. This project's declarations load first, so nobody else
can take their names, ports or catalog sections. A daemon calls :func:`serve_as` before it serves: from then on its
process uses only this project's declarations and its own (a package it does not serve is never asked for a
catalog section), and a fault in those, or a package colliding with its own declaration, is one RegistryError line
(the daemon exits 2).
"""

from __future__ import annotations

import dataclasses
import importlib
import logging
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cache
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from importlib.metadata import EntryPoint

GROUP = "aws_accel_agents.accelerators"

log = logging.getLogger(__name__)


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
    """``package:file.yaml``: its sections of the instance types it knows (``types: {name: {family, <section>:
    ...}}``, optional ``defaults``); the catalog merges every accelerator's file by type."""
    fakehost: str | None = None
    """``module:attribute`` of its fake-host part (:class:`accel_core.fakehost.parts.HostPart` subclass): its
    files, mutations, build flags, fault verbs and ``fake-sysfs --list`` columns."""
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


def _who(acc: Accelerator) -> str:
    return f"{acc.name} of {acc.distribution}" if acc.distribution else acc.name


def _claims(acc: Accelerator) -> list[tuple[tuple[str, object], str]]:
    """What ``acc`` claims, each ``((kind, value), owner label)``; one value twice in it is a collision too."""
    of = f" of {acc.distribution}" if acc.distribution else ""
    out: list[tuple[tuple[str, object], str]] = [(("accelerator", acc.name), _who(acc))]
    for d in acc.daemons:
        out.append((("console script", d.script), f"{acc.name}/{d.script}{of}"))
        ports = [("metrics", d.metrics_port), ("health", d.health_port)] if d.on_node else []
        out += [(("port", port), f"{acc.name}/{d.script} ({what}){of}") for what, port in ports if port]
    out += [(("catalog section", repr(key)), _who(acc)) for key in acc.catalog_sections]
    return out


class _Book:
    """Who claimed each name, script, port and catalog section: a claim belongs to one declaration (by its
    position), so two declarations of the same name collide like any two others."""

    def __init__(self) -> None:
        self._owners: dict[tuple[str, object], tuple[int, str]] = {}

    def clash(self, key: int, acc: Accelerator) -> tuple[int, str] | None:
        """The first claim of ``acc`` already taken (or taken twice in ``acc``): the other's position and a line
        naming both owners."""
        mine: dict[tuple[str, object], str] = {}
        for (kind, value), owner in _claims(acc):
            other = self._owners.get((kind, value))
            if other is not None and other != (key, owner):
                return other[0], f"{kind} {value} is claimed by both {other[1]} and {owner}"
            if mine.setdefault((kind, value), owner) != owner:
                return key, f"{kind} {value} is claimed by both {mine[(kind, value)]} and {owner}"
        return None

    def take(self, key: int, acc: Accelerator) -> None:
        for claim, owner in _claims(acc):
            self._owners.setdefault(claim, (key, owner))


def check(accels: tuple[Accelerator, ...]) -> None:
    """Refuse duplicate names, scripts, node ports and catalog sections, naming both owners."""
    book = _Book()
    for key, acc in enumerate(accels):
        found = book.clash(key, acc)
        if found is not None:
            raise RegistryError(found[1])
        book.take(key, acc)


# ------------------------------------------------------------------------------------------------- loading

#: the project's own distribution: its declarations are always loaded (the packaged catalog has their sections),
#: first, so no other package can take one of their names, scripts, ports or sections
CORE_DISTRIBUTION = "aws-accel-agents"
_MAX_REASON = 300

_serving: str | None = None
"""The console script this process runs as (:func:`serve_as`); None: a tool, which uses every accelerator."""
_logged: set[str] = set()


def _dist_name(name: str | None) -> str:
    return re.sub(r"[-_.]+", "-", name or "").lower()


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    text = f"{type(exc).__name__}: {text}" if text else type(exc).__name__
    return text if len(text) <= _MAX_REASON else text[:_MAX_REASON] + "..."


def _load(ep: EntryPoint) -> Accelerator:
    """One entry point's declaration; RegistryError (one line) for anything it raises or a wrong shape."""
    dist = getattr(ep, "dist", None)
    where = f"entry point {ep.name} ({ep.value}) of {dist.name if dist is not None else 'no distribution'}"
    try:
        acc = ep.load()
    except BaseException as exc:  # ImportError, SystemExit, a bare BaseException: whatever its import raises
        raise RegistryError(f"{where} cannot be loaded: {_one_line(exc)}") from None
    if not isinstance(acc, Accelerator):
        raise RegistryError(f"{where} is not an Accelerator declaration (a {type(acc).__name__})")
    bad = _shape_problem(acc)
    if bad:
        raise RegistryError(f"{where}: {bad}")
    return dataclasses.replace(acc, distribution=dist.name if dist is not None else "")


def _shape_problem(acc: Accelerator) -> str | None:
    if not isinstance(acc.name, str) or not acc.name:
        return "its name is not a non-empty string"
    if not isinstance(acc.daemons, tuple) or not all(isinstance(d, Daemon) for d in acc.daemons):
        return "daemons is not a tuple of Daemon"
    for d in acc.daemons:
        if not isinstance(d.script, str) or not all(p is None or type(p) is int for p in (d.metrics_port,
                                                                                          d.health_port)):
            return f"daemon {d.script!r}: the script is not a string or a port is not an integer"
    if not isinstance(acc.catalog_sections, Mapping) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in acc.catalog_sections.items()):
        return "catalog_sections is not a mapping of strings"
    return None


def _warn_once(line: str) -> None:
    if line not in _logged:
        _logged.add(line)
        log.warning(line)


def _dist_of(ep: EntryPoint) -> str:
    dist = getattr(ep, "dist", None)
    return _dist_name(dist.name if dist is not None else None)


def _own_distribution(script: str) -> str | None:
    """The distribution that installs the console script ``script`` (read from metadata: nothing is imported)."""
    from importlib.metadata import entry_points

    return next((_dist_of(e) for e in entry_points(group="console_scripts") if e.name == script), None)


def _load_all(serving: str | None) -> tuple[Accelerator, ...]:
    """Every usable declaration, this project's first, then the others by entry-point name. One that cannot be
    loaded or collides is logged once and left out, unless it is this project's, the served daemon's own (or of
    its distribution), or it collides with that: then RegistryError."""
    from importlib.metadata import entry_points  # here: the daemons' start-up imports this module

    own_dist = _own_distribution(serving) if serving is not None else None
    eps = sorted(entry_points(group=GROUP), key=lambda e: (_dist_of(e) != CORE_DISTRIBUTION, e.name, e.value))
    book, accepted = _Book(), dict[int, Accelerator]()
    for key, ep in enumerate(eps):
        required = _dist_of(ep) in (CORE_DISTRIBUTION, own_dist)
        try:
            acc = _load(ep)
        except RegistryError as exc:
            if required:
                raise
            _warn_once(f"ignoring an accelerator: {exc}")
            continue
        found = book.clash(key, acc)
        if found is not None:
            other = accepted.get(found[0])
            if required or serving in acc.scripts or (other is not None and serving in other.scripts):
                raise RegistryError(found[1])
            _warn_once(f"ignoring accelerator {_who(acc)} (entry point {ep.name}): {found[1]}")
            continue
        book.take(key, acc)
        accepted[key] = acc
    return tuple(accepted.values())


@cache
def accelerators() -> tuple[Accelerator, ...]:
    """The registered accelerators this process uses: all of them in a tool, this project's and the daemon's own in
    a daemon (:func:`serve_as`). RegistryError (one line) only for a fault in those (module docstring)."""
    found = _load_all(_serving)
    if _serving is None:
        return found
    return tuple(a for a in found if _dist_name(a.distribution) == CORE_DISTRIBUTION or _serving in a.scripts)


def serve_as(script: str) -> Accelerator:
    """Use only the accelerators the daemon ``script`` serves, from now on in this process, and return its own
    declaration; RegistryError (one line) when it is missing or broken, or another package collides with it."""
    global _serving
    _serving = script
    accelerators.cache_clear()
    own = next((acc for acc in accelerators() if script in acc.scripts), None)
    if own is None:
        raise RegistryError(f"no installed accelerator declares the console script {script!r}")
    return own


def daemons() -> tuple[Daemon, ...]:
    return tuple(d for acc in accelerators() for d in acc.daemons)


def daemon(script: str) -> Daemon:
    """The declaration of one console script; KeyError names the known ones."""
    for d in daemons():
        if d.script == script:
            return d
    raise KeyError(f"no accelerator declares the console script {script!r} "
                   f"(declared: {', '.join(d.script for d in daemons())})")
