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
from typing import Annotated, Any, Literal, get_args

import msgspec

from accel_core.dra.config import decode_struct
from neuron_dra import DRA_DRIVER_NAME
from neuron_dra.facts.ultraserver import SET_SIZES

API_VERSION = f"{DRA_DRIVER_NAME}/v1"
KIND = "NeuronConfig"
ULTRASERVER_KIND = "UltraServerConfig"
ApiVersion = Literal["neuron.aws.com/v1"]
Lnc = Literal[1, 2]
UltraServerMode = Annotated[Literal[1, 2, 4], msgspec.Meta(description="nodes in the UltraServer set")]
assert get_args(ApiVersion) == (API_VERSION,)
assert get_args(get_args(UltraServerMode)[0]) == SET_SIZES, "UltraServerMode must list the UltraServer set sizes"


class _NeuronParams(msgspec.Struct, tag_field="kind", tag=KIND, forbid_unknown_fields=True, frozen=True):
    apiVersion: ApiVersion  # noqa: N815 (the API's field name)
    logicalNeuronCore: Lnc | None = None  # noqa: N815


class _UltraServerParams(msgspec.Struct, tag_field="kind", tag=ULTRASERVER_KIND, forbid_unknown_fields=True,
                         frozen=True):
    apiVersion: ApiVersion  # noqa: N815
    ultraserverMode: UltraServerMode  # noqa: N815


@dataclass(frozen=True)
class NeuronConfig:
    """The decoded settings; None means "not set" (the node's default applies)."""

    logical_neuron_core: int | None = None
    ultraserver_mode: int | None = None
    """Nodes in the UltraServer set (1, 2 or 4), from an ``UltraServerConfig``."""


def decode_parameters(raw: Any, where: str) -> NeuronConfig:
    """Decode one ``opaque.parameters`` value (ConfigError naming ``where`` and the field)."""
    params = decode_struct(raw, where, (_NeuronParams, _UltraServerParams))
    if isinstance(params, _UltraServerParams):
        return NeuronConfig(ultraserver_mode=params.ultraserverMode)
    assert isinstance(params, _NeuronParams)
    return NeuronConfig(logical_neuron_core=params.logicalNeuronCore)

