"""Opaque claim configuration: which entries apply to which request, in which order, and strict-decoding helpers.

A claim (or its DeviceClass) may carry opaque configs for a driver. Class configs apply first and claim configs
after them, so a claim overrides its class; within each source, later entries override earlier ones. An entry
applies to a request when it lists no requests or lists the request (or its parent, for ``request/subrequest``).
Every entry for the driver is decoded, applicable or not, so a bad config fails the claim (strict).

A driver's config type is a frozen dataclass whose fields default to None ("not set"); overriding keeps the fields
the later config leaves unset. The driver profile decodes one entry's parameters with :func:`decode_struct`: its
kinds are msgspec Structs tagged by ``kind``, with an ``apiVersion`` Literal and ``Literal`` value sets, decoded
strictly (the parameters must be a JSON object, not a string holding JSON; no unknown field, no type coercion).
msgspec's error becomes one short line naming the config's place and the field; names and values are cut to 40
characters whatever the input.
"""

from __future__ import annotations

import dataclasses
import re
import typing
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import msgspec
from lightkube.models.resource_v1 import DeviceAllocationConfiguration

ConfigT = TypeVar("ConfigT")
StructT = TypeVar("StructT", bound=msgspec.Struct)


MAX_SHOWN = 40
"""Characters of a field name or value an error quotes."""


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


_MSGSPEC_ERROR = re.compile(r"^(?P<what>.*?)(?: - at `\$(?P<path>[^`]*)`)?$", re.DOTALL)
_QUOTED = re.compile(r"`([^`]*)`")
_JSON_TYPES = {"str": "a string", "bytes": "a string", "array": "an array", "null": "null", "int": "a number",
               "float": "a number", "bool": "a boolean"}


def decode_struct(raw: Any, where: str, kinds: Sequence[type[StructT]]) -> StructT:
    """``raw`` decoded strictly as one of ``kinds`` (Structs tagged by ``kind``, each with an ``apiVersion``
    Literal), or ConfigError: ``<where>: <field> ...``, one short line."""
    target: Any = typing.Union[tuple(kinds)]  # noqa: UP007 (a Union built at run time)
    try:
        result: StructT = msgspec.convert(raw, target, strict=True)
    except msgspec.ValidationError as exc:
        raise ConfigError(f"{where}: {_explain(str(exc), raw, kinds)}") from None
    except ValueError:  # msgspec could not even print a value (an int of more than 4300 digits)
        huge = [k for k, v in raw.items() if _huge(v)] if isinstance(raw, Mapping) else []
        message = f"Invalid value - at `$.{huge[0]}`" if huge else "Invalid value"
        raise ConfigError(f"{where}: {_explain(message, raw, kinds)}") from None
    return result


def _explain(message: str, raw: Any, kinds: Sequence[type[msgspec.Struct]]) -> str:
    """msgspec's validation message in the config's own words (field, allowed values, what it got)."""
    match = _MSGSPEC_ERROR.match(message)
    what, path = (match["what"], match["path"] or "") if match else (message, "")
    if not isinstance(raw, Mapping):
        sent = re.search(r"got `(\w+)`", what)
        return f"parameters must be an object, got {_JSON_TYPES.get(sent[1], sent[1]) if sent else 'something else'}"
    missing = re.match(r"Object missing required field `([^`]*)`", what)
    field = missing[1] if missing else path[1:] if path.startswith(".") and "." not in path[1:] else ""
    tags = [k.__struct_config__.tag for k in kinds]
    api_version = _allowed(kinds[0], "apiVersion")
    if field == "kind":
        use = " or ".join(repr(t) for t in tags)
        return f"kind {_short(raw.get('kind'))} is not supported; use {use}"
    if field == "apiVersion":
        return f"apiVersion {_short(raw.get('apiVersion'))} is not supported; use {' or '.join(map(repr, api_version))}"
    kind = next((k for k in kinds if k.__struct_config__.tag == raw.get("kind")), kinds[0])
    unknown = re.match(r"Object contains unknown field `(.*)`$", what, re.DOTALL)
    if unknown:
        known = ", ".join(sorted(("kind", *kind.__struct_fields__)))
        return f"strict decoding error: unknown field {_short(unknown[1])} (known: {known})"
    allowed = _allowed(kind, field) if field else ()
    if allowed:
        values = " or ".join(map(str, allowed)) if len(allowed) == 2 else f"one of {', '.join(map(str, allowed))}"
        note = _description(kind, field)
        got = "nothing" if missing else _short(raw.get(field))
        return f"{field} must be {values}{f' ({note})' if note else ''}, got {got}"
    text = _QUOTED.sub(lambda m: _short(m[1]).strip("'"), what)
    return f"{field}: {text}" if field else text


def _hints(kind: type[msgspec.Struct], field: str) -> tuple[Any, ...]:
    hint = typing.get_type_hints(kind, include_extras=True).get(field)
    return (hint, *typing.get_args(hint)) if hint is not None else ()


def _allowed(kind: type[msgspec.Struct], field: str) -> tuple[Any, ...]:
    """The values a Literal field takes (through ``Annotated`` and ``| None``), else ()."""
    for hint in _hints(kind, field):
        for part in (hint, *typing.get_args(hint)):
            if typing.get_origin(part) is typing.Literal:
                return typing.get_args(part)
    return ()


def _description(kind: type[msgspec.Struct], field: str) -> str:
    for hint in _hints(kind, field):
        if isinstance(hint, msgspec.Meta) and hint.description:
            return hint.description
    return ""


def _short(value: Any) -> str:
    """``repr`` of a name or value, cut to MAX_SHOWN characters (a huge int is not even turned into digits)."""
    if _huge(value):
        return "a number too large"
    if isinstance(value, str):
        return repr(value if len(value) <= MAX_SHOWN else value[:MAX_SHOWN] + "...")
    if isinstance(value, Mapping | list | tuple):
        return "an object" if isinstance(value, Mapping) else "an array"
    text = repr(value)
    return text if len(text) <= MAX_SHOWN else text[:MAX_SHOWN] + "..."


def _huge(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 128


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
