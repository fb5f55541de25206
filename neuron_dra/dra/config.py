"""Strict decoding of the Neuron driver's opaque claim configuration.

A claim (or its DeviceClass) may carry, for driver ``neuron.aws.com``::

    parameters:
      apiVersion: neuron.aws.com/v1
      kind: NeuronConfig
      logicalNeuronCore: 1        # or 2; only on generations with a Logical NeuronCore setting (Trainium2+)

Decoding is strict: an unknown field, a wrong ``apiVersion`` or ``kind``, or a bad value is an error that names
the field and the config's place in the allocation. Precedence (class, then claim; later wins) is the core's
(:mod:`accel_core.dra.config`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from accel_core.dra.config import ConfigError, OpaqueEntry, check_fields, check_type, parameters_object
from accel_core.dra.config import configs_for_requests as _configs_for_requests

DRIVER_NAME = "neuron.aws.com"
API_VERSION = "neuron.aws.com/v1"
KIND = "NeuronConfig"
KNOWN_KINDS_NOT_HANDLED = ("UltraServerConfig",)
LNC_VALUES = (1, 2)
_FIELDS = ("apiVersion", "kind", "logicalNeuronCore")

__all__ = ["ConfigError", "NeuronConfig", "OpaqueEntry", "configs_for_requests", "decode_parameters"]


@dataclass(frozen=True)
class NeuronConfig:
    """The decoded settings; None means "not set" (the node's default applies)."""

    logical_neuron_core: int | None = None


def decode_parameters(raw: Any, where: str) -> NeuronConfig:
    """Decode one ``opaque.parameters`` value."""
    params = parameters_object(raw, where)
    check_fields(params, where, _FIELDS)
    kind = params.get("kind")
    hint = " (UltraServer configuration is not supported by this driver)" if kind in KNOWN_KINDS_NOT_HANDLED else ""
    check_type(params, where, API_VERSION, KIND, hint)
    lnc = params.get("logicalNeuronCore")
    if lnc is not None and (isinstance(lnc, bool) or not isinstance(lnc, int) or lnc not in LNC_VALUES):
        raise ConfigError(f"{where}: logicalNeuronCore must be 1 or 2, got {lnc!r}")
    return NeuronConfig(logical_neuron_core=lnc)


def configs_for_requests(entries: Sequence[OpaqueEntry], requests: Sequence[str]) -> dict[str, NeuronConfig]:
    """The effective NeuronConfig per request name (see :func:`accel_core.dra.config.configs_for_requests`)."""
    return _configs_for_requests(entries, requests, driver=DRIVER_NAME, decode=decode_parameters,
                                 default=NeuronConfig())
