"""Opaque claim configuration: which entries apply to which request, in which order, and strict-decoding helpers.

A claim (or its DeviceClass) may carry opaque configs for a driver. Class configs apply first and claim configs
after them, so a claim overrides its class; within each source, later entries override earlier ones. An entry
applies to a request when it lists no requests or lists the request (or its parent, for ``request/subrequest``).
Every entry for the driver is decoded, applicable or not, so a bad config fails the claim (strict).

A driver's config type is a frozen dataclass whose fields default to None ("not set"); overriding keeps the fields
the later config leaves unset. The driver profile decodes one entry's parameters; the helpers here do the checks
every decoder makes: the parameters are a JSON object (a string holding JSON is refused), the apiVersion and kind
are the driver's, and there is no unknown field. Errors stay short whatever the input (a few field names, each
cut to 40 characters, and a count of the rest).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from lightkube.models.resource_v1 import DeviceAllocationConfiguration

ConfigT = TypeVar("ConfigT")


MAX_SHOWN = 5
"""Unknown field names an error lists before it says how many more there are."""


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
    def from_api(cls, entry: DeviceAllocationConfiguration) -> OpaqueEntry:
        opaque = entry.opaque
        return cls(source=entry.source, requests=tuple(entry.requests or ()),
                   driver=opaque.driver if opaque else "", parameters=opaque.parameters if opaque else None)

    def applies_to(self, request: str) -> bool:
        if not self.requests:
            return True
        base = request.split("/", 1)[0]
        return request in self.requests or base in self.requests


def parameters_object(raw: Any, where: str) -> Mapping[str, Any]:
    """The parameters, which must be a JSON object (never text to parse: that is not what the API server stores)."""
    if not isinstance(raw, Mapping):
        raise ConfigError(f"{where}: parameters must be an object, got {_json_type(raw)}")
    return raw


def _json_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, str | bytes | bytearray):
        return "a string"
    if isinstance(value, list | tuple):
        return "an array"
    return type(value).__name__


def check_fields(raw: Mapping[str, Any], where: str, known: Sequence[str]) -> None:
    """ConfigError naming the unknown fields, if any: the first few, each cut short, and how many more."""
    unknown = [k for k in raw if k not in known]
    if unknown:
        first = sorted(str(k) for k in unknown[:200])[:MAX_SHOWN]
        names = ", ".join(repr(k if len(k) <= 40 else k[:40] + "...") for k in first)
        more = f" and {len(unknown) - len(first)} more" if len(unknown) > len(first) else ""
        raise ConfigError(f"{where}: strict decoding error: unknown field {names}{more} "
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
