"""Issue 24 item 4: opaque claim configs decode through msgspec Structs; whatever JSON a claim carries, the
decoders answer with a config or a ConfigError of one short line naming where the config sits, never with another
exception."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from accel_core.dra.config import ConfigError
from efa_plugin.dra.profile import EfaConfig, EfaProfile
from neuron_dra.dra.config import NeuronConfig, decode_parameters

WHERE = "config[3] (FromClaim, requests neurons)"
NAMES = st.sampled_from(["apiVersion", "kind", "logicalNeuronCore", "ultraserverMode", "colour"]) | st.text()
SCALARS = (st.none() | st.booleans() | st.integers() | st.integers(4300, 4400).map(lambda n: 10**n)
           | st.floats() | st.text() | st.sampled_from(["neuron.aws.com/v1", "efa.aws.com/v1", "NeuronConfig",
                                                        "UltraServerConfig", "EfaConfig", 1, 2, 4]))
JSON = st.recursive(SCALARS, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(NAMES, inner, max_size=5),
                    max_leaves=12)
#: objects that look like configs (right apiVersion and kind) with arbitrary other fields, so the field checks run
CONFIGS = st.builds(lambda base, extra: {**extra, **base},
                    st.sampled_from([{"apiVersion": "neuron.aws.com/v1", "kind": "NeuronConfig"},
                                     {"apiVersion": "neuron.aws.com/v1", "kind": "UltraServerConfig"},
                                     {"apiVersion": "efa.aws.com/v1", "kind": "EfaConfig"}]),
                    st.dictionaries(NAMES, JSON, max_size=3))


def decoded_or_config_error(decode: Any, raw: Any) -> object:
    try:
        return decode(raw, WHERE)
    except ConfigError as exc:
        message = str(exc)
        assert message.startswith(WHERE + ": ")
        assert "\n" not in message, message
        assert len(message) < 300, message
        return exc


@settings(max_examples=200, deadline=None)
@given(JSON | CONFIGS)
def test_neuron_config_decoding_refuses_anything_else_with_a_config_error(raw: Any) -> None:
    result = decoded_or_config_error(decode_parameters, raw)
    if isinstance(result, NeuronConfig):  # only a well-formed object decodes
        assert isinstance(raw, dict) and raw.get("apiVersion") == "neuron.aws.com/v1"
        assert result.logical_neuron_core in (None, 1, 2) and result.ultraserver_mode in (None, 1, 2, 4)


@settings(max_examples=200, deadline=None)
@given(JSON | CONFIGS)
def test_efa_config_decoding_refuses_anything_else_with_a_config_error(raw: Any) -> None:
    result = decoded_or_config_error(EfaProfile().decode_config, raw)
    if isinstance(result, EfaConfig):
        assert raw == {"apiVersion": "efa.aws.com/v1", "kind": "EfaConfig"}


def test_a_huge_number_is_named_by_its_field_not_printed() -> None:
    raw = {"apiVersion": "neuron.aws.com/v1", "kind": "NeuronConfig", "logicalNeuronCore": 10**5000}
    result = decoded_or_config_error(decode_parameters, raw)
    assert str(result) == f"{WHERE}: logicalNeuronCore must be 1 or 2, got a number too large"
