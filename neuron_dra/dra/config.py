"""Strict decoding of the Neuron driver's opaque claim configuration.

A claim (or its DeviceClass) may carry, for driver ``neuron.aws.com``::

    parameters:
      apiVersion: neuron.aws.com/v1
      kind: NeuronConfig
      logicalNeuronCore: 1        # or 2; only on generations with a Logical NeuronCore setting (Trainium2+)

    parameters:
      apiVersion: neuron.aws.com/v1
      kind: UltraServerConfig
      ultraserverMode: 4          # nodes in the UltraServer set: 1, 2 or 4 (for a neuron_node device)

Both kinds may apply to one request; their fields add up (a later config of either kind overrides the fields it
sets).

Decoding is strict: an unknown field, a wrong ``apiVersion`` or ``kind``, or a bad value is an error that names
the field and the config's place in the allocation. Precedence (class, then claim; later wins) is the core's
(:mod:`accel_core.dra.config`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from accel_core.awsfacts.ultraserver import SET_SIZES
from accel_core.dra.config import ConfigError, check_fields, check_type, parameters_object
from neuron_dra import DRA_DRIVER_NAME

API_VERSION = f"{DRA_DRIVER_NAME}/v1"
KIND = "NeuronConfig"
ULTRASERVER_KIND = "UltraServerConfig"
LNC_VALUES = (1, 2)
_FIELDS = {KIND: ("apiVersion", "kind", "logicalNeuronCore"),
           ULTRASERVER_KIND: ("apiVersion", "kind", "ultraserverMode")}

@dataclass(frozen=True)
class NeuronConfig:
    """The decoded settings; None means "not set" (the node's default applies)."""

    logical_neuron_core: int | None = None
    ultraserver_mode: int | None = None
    """Nodes in the UltraServer set (1, 2 or 4), from an ``UltraServerConfig``."""


def decode_parameters(raw: Any, where: str) -> NeuronConfig:
    """Decode one ``opaque.parameters`` value."""
    params = parameters_object(raw, where)
    kind = params.get("kind")
    if kind == ULTRASERVER_KIND:
        check_fields(params, where, _FIELDS[ULTRASERVER_KIND])
        check_type(params, where, API_VERSION, ULTRASERVER_KIND)
        mode = params.get("ultraserverMode")
        if isinstance(mode, bool) or not isinstance(mode, int) or mode not in SET_SIZES:
            raise ConfigError(f"{where}: ultraserverMode must be one of {', '.join(map(str, SET_SIZES))} "
                              f"(nodes in the UltraServer set), got {mode!r}")
        return NeuronConfig(ultraserver_mode=mode)
    check_fields(params, where, _FIELDS[KIND])
    check_type(params, where, API_VERSION, KIND, f" or {ULTRASERVER_KIND!r}")
    lnc = params.get("logicalNeuronCore")
    if lnc is not None and (isinstance(lnc, bool) or not isinstance(lnc, int) or lnc not in LNC_VALUES):
        raise ConfigError(f"{where}: logicalNeuronCore must be 1 or 2, got {lnc!r}")
    return NeuronConfig(logical_neuron_core=lnc)
