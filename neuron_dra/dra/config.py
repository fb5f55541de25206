"""Strict decoding of the driver's opaque claim configuration.

A claim (or its DeviceClass) may carry, for driver ``neuron.aws.com``::

    parameters:
      apiVersion: neuron.aws.com/v1
      kind: NeuronConfig
      logicalNeuronCore: 1        # or 2; only on generations with a Logical NeuronCore setting (Trainium2+)

Decoding is strict: an unknown field, a wrong ``apiVersion`` or ``kind``, or a bad value is an error that names
the field and the config's place in the allocation. Class configs apply first and claim configs after them, so a
claim overrides its class; within each source, later entries override earlier ones. An entry applies to a request
when it lists no requests or lists the request (or its parent, for ``request/subrequest``).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

DRIVER_NAME = "neuron.aws.com"
API_VERSION = "neuron.aws.com/v1"
KIND = "NeuronConfig"
KNOWN_KINDS_NOT_HANDLED = ("UltraServerConfig",)
LNC_VALUES = (1, 2)
_FIELDS = ("apiVersion", "kind", "logicalNeuronCore")


class ConfigError(ValueError):
    """An opaque config could not be decoded; the message names the field and where the config came from."""


@dataclass(frozen=True)
class NeuronConfig:
    """The decoded settings; None means "not set" (the node's default applies)."""

    logical_neuron_core: int | None = None

    def overridden_by(self, other: NeuronConfig) -> NeuronConfig:
        return NeuronConfig(
            logical_neuron_core=other.logical_neuron_core if other.logical_neuron_core is not None
            else self.logical_neuron_core)


def decode_parameters(raw: Any, where: str) -> NeuronConfig:
    """Decode one ``opaque.parameters`` value (a mapping, or JSON text/bytes)."""
    if isinstance(raw, bytes | bytearray):
        raw = raw.decode("utf-8", "replace")
    if isinstance(raw, str):
        try:
            raw = json.loads(raw)
        except ValueError as exc:
            raise ConfigError(f"{where}: parameters are not valid JSON: {exc}") from exc
    if not isinstance(raw, Mapping):
        raise ConfigError(f"{where}: parameters must be an object, got {type(raw).__name__}")
    unknown = sorted(str(k) for k in raw if k not in _FIELDS)
    if unknown:
        raise ConfigError(f"{where}: strict decoding error: unknown field {', '.join(repr(u) for u in unknown)} "
                          f"(known: {', '.join(_FIELDS)})")
    api_version = raw.get("apiVersion")
    if api_version != API_VERSION:
        raise ConfigError(f"{where}: apiVersion {api_version!r} is not supported; use {API_VERSION!r}")
    kind = raw.get("kind")
    if kind != KIND:
        hint = " (UltraServer configuration is not supported by this driver)" if kind in KNOWN_KINDS_NOT_HANDLED else ""
        raise ConfigError(f"{where}: kind {kind!r} is not supported; use {KIND!r}{hint}")
    lnc = raw.get("logicalNeuronCore")
    if lnc is not None and (isinstance(lnc, bool) or not isinstance(lnc, int) or lnc not in LNC_VALUES):
        raise ConfigError(f"{where}: logicalNeuronCore must be 1 or 2, got {lnc!r}")
    return NeuronConfig(logical_neuron_core=lnc)


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


def _ordered(entries: Sequence[OpaqueEntry]) -> list[tuple[int, OpaqueEntry]]:
    """Class configs first, then claim configs, each in their original order (sorted() is stable)."""
    rank = {"FromClass": 0, "FromClaim": 1}
    return sorted(enumerate(entries), key=lambda p: rank.get(p[1].source, 1))


def configs_for_requests(entries: Sequence[OpaqueEntry], requests: Sequence[str]) -> dict[str, NeuronConfig]:
    """The effective config per request name. Every entry for this driver is decoded, applicable or not."""
    decoded: list[tuple[OpaqueEntry, NeuronConfig]] = []
    for position, entry in _ordered(entries):
        if entry.driver != DRIVER_NAME:
            continue
        where = f"config[{position}] ({entry.source or 'unknown source'}"
        where += f", requests {', '.join(entry.requests)})" if entry.requests else ")"
        decoded.append((entry, decode_parameters(entry.parameters, where)))
    out: dict[str, NeuronConfig] = {}
    for request in requests:
        config = NeuronConfig()
        for entry, value in decoded:
            if entry.applies_to(request):
                config = config.overridden_by(value)
        out[request] = config
    return out
