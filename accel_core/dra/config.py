"""Opaque claim configuration: which entries apply to which request, in which order, and strict-decoding helpers.

A claim (or its DeviceClass) may carry opaque configs for a driver. Class configs apply first and claim configs
after them, so a claim overrides its class; within each source, later entries override earlier ones. An entry
applies to a request when it lists no requests or lists the request (or its parent, for ``request/subrequest``).
Every entry for the driver is decoded, applicable or not, so a bad config fails the claim (strict).

A driver's config type is a frozen dataclass whose fields default to None ("not set"); overriding keeps the fields
the later config leaves unset. The driver profile decodes one entry's parameters; the helpers here do the checks
every decoder makes (an object, the apiVersion and kind, no unknown field).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

ConfigT = TypeVar("ConfigT")


class ConfigError(ValueError):
    """An opaque config could not be decoded; the message names the field and where the config came from."""


@dataclass(frozen=True)
class OpaqueEntry:
    """One ``status.allocation.devices.config`` entry, reduced to what matters here."""

    source: str  # "FromClass" or "FromClaim"
    requests: tuple[str, ...]
    driver: str
    parameters: Any

    @classmethod
    def from_api(cls, entry: Mapping[str, Any]) -> OpaqueEntry:
        opaque = entry.get("opaque") or {}
        return cls(source=str(entry.get("source", "")), requests=tuple(entry.get("requests") or ()),
                   driver=str(opaque.get("driver", "")), parameters=opaque.get("parameters"))

    def applies_to(self, request: str) -> bool:
        if not self.requests:
            return True
        base = request.split("/", 1)[0]
        return request in self.requests or base in self.requests


def parameters_object(raw: Any, where: str) -> Mapping[str, Any]:
    """The parameters as a mapping (a mapping, or JSON text/bytes); ConfigError otherwise."""
    if isinstance(raw, bytes | bytearray):
        raw = raw.decode("utf-8", "replace")
    if isinstance(raw, str):
        try:
            raw = json.loads(raw)
        except ValueError as exc:
            raise ConfigError(f"{where}: parameters are not valid JSON: {exc}") from exc
    if not isinstance(raw, Mapping):
        raise ConfigError(f"{where}: parameters must be an object, got {type(raw).__name__}")
    return raw


def check_fields(raw: Mapping[str, Any], where: str, known: Sequence[str]) -> None:
    """ConfigError naming the unknown fields, if any."""
    unknown = sorted(str(k) for k in raw if k not in known)
    if unknown:
        raise ConfigError(f"{where}: strict decoding error: unknown field {', '.join(repr(u) for u in unknown)} "
                          f"(known: {', '.join(known)})")


def check_type(raw: Mapping[str, Any], where: str, api_version: str, kind: str, hint: str = "") -> None:
    """ConfigError unless ``apiVersion`` and ``kind`` are the driver's."""
    got = raw.get("apiVersion")
    if got != api_version:
        raise ConfigError(f"{where}: apiVersion {got!r} is not supported; use {api_version!r}")
    got = raw.get("kind")
    if got != kind:
        raise ConfigError(f"{where}: kind {got!r} is not supported; use {kind!r}{hint}")


def override(base: ConfigT, later: ConfigT) -> ConfigT:
    """``base`` with every field that ``later`` sets (not None)."""
    if not dataclasses.is_dataclass(later):
        return later
    changes = {f.name: getattr(later, f.name) for f in dataclasses.fields(later)
               if getattr(later, f.name) is not None}
    return dataclasses.replace(base, **changes)  # type: ignore[type-var]


def _ordered(entries: Sequence[OpaqueEntry]) -> list[tuple[int, OpaqueEntry]]:
    """Class configs first, then claim configs, each in their original order (sorted() is stable)."""
    rank = {"FromClass": 0, "FromClaim": 1}
    return sorted(enumerate(entries), key=lambda p: rank.get(p[1].source, 1))


def configs_for_requests(
    entries: Sequence[OpaqueEntry],
    requests: Sequence[str],
    *,
    driver: str,
    decode: Callable[[Any, str], ConfigT],
    default: ConfigT,
) -> dict[str, ConfigT]:
    """The effective config per request name. Every entry for ``driver`` is decoded, applicable or not."""
    decoded: list[tuple[OpaqueEntry, ConfigT]] = []
    for position, entry in _ordered(entries):
        if entry.driver != driver:
            continue
        where = f"config[{position}] ({entry.source or 'unknown source'}"
        where += f", requests {', '.join(entry.requests)})" if entry.requests else ")"
        decoded.append((entry, decode(entry.parameters, where)))
    out: dict[str, ConfigT] = {}
    for request in requests:
        config = default
        for entry, value in decoded:
            if entry.applies_to(request):
                config = override(config, value)
        out[request] = config
    return out
