"""Strict decoding of NeuronConfig opaque parameters and class/claim precedence."""

from __future__ import annotations

from typing import Any

import pytest
from drarig import configs
from lightkube.models.resource_v1 import DeviceAllocationConfiguration, OpaqueDeviceConfiguration

from accel_core.dra.config import ConfigError, OpaqueEntry
from neuron_dra.dra.config import NeuronConfig, decode_parameters
from neuron_dra.dra.profile import NeuronProfile

GOOD = {"apiVersion": "neuron.aws.com/v1", "kind": "NeuronConfig", "logicalNeuronCore": 1}


def entry(source: str, params: Any, requests: tuple[str, ...] = (), driver: str = "neuron.aws.com") -> OpaqueEntry:
    return OpaqueEntry.from_api(DeviceAllocationConfiguration(
        source=source, requests=list(requests), opaque=OpaqueDeviceConfiguration(driver=driver, parameters=params)))


def test_good_config() -> None:
    assert decode_parameters(GOOD, "x") == NeuronConfig(1)
    assert decode_parameters({"apiVersion": "neuron.aws.com/v1", "kind": "NeuronConfig"}, "x") == NeuronConfig()


@pytest.mark.parametrize(("params", "got"), [
    ('{"apiVersion": "neuron.aws.com/v1", "kind": "NeuronConfig"}', "a string"),
    (b'{"apiVersion":"neuron.aws.com/v1","kind":"NeuronConfig","logicalNeuronCore":2}', "a string"),
    ([GOOD], "an array"), (None, "null"), (3, "a number"),
])
def test_parameters_must_be_an_object(params: Any, got: str) -> None:
    # JSON text is what the API server would never store there: strict decoding refuses it (issue 14 item 8)
    with pytest.raises(ConfigError, match=f"config\\[0\\]: parameters must be an object, got {got}$"):
        decode_parameters(params, "config[0]")


def test_unknown_field_errors_stay_short() -> None:
    params = {**GOOD, **{f"field{i:05d}-{'x' * 200}": i for i in range(60_000)}}
    with pytest.raises(ConfigError) as err:
        decode_parameters(params, "config[0]")
    message = str(err.value)
    assert len(message) < 500, f"{len(message)} characters"
    assert "unknown field 'field00000-" + "x" * 29 + "...'" in message  # the first one, cut short


@pytest.mark.parametrize(("params", "pattern"), [
    ({**GOOD, "colour": "red"}, r"strict decoding error: unknown field 'colour'"),
    ({**GOOD, "logicalNeuronCores": 1}, r"unknown field 'logicalNeuronCores'"),
    ({**GOOD, "kind": "GpuConfig"}, r"kind 'GpuConfig' is not supported; use 'NeuronConfig'"),
    ({**GOOD, "kind": "UltraServerConfig"}, r"unknown field 'logicalNeuronCore'.*known: apiVersion, kind, "
                                             r"ultraserverMode"),
    ({"apiVersion": "neuron.aws.com/v1", "kind": "UltraServerConfig", "ultraserverMode": 3},
     r"ultraserverMode must be one of 1, 2, 4 \(nodes in the UltraServer set\), got 3"),
    ({"apiVersion": "neuron.aws.com/v1", "kind": "UltraServerConfig", "ultraserverMode": "4"},
     r"ultraserverMode must be one of 1, 2, 4.*got '4'"),
    ({"apiVersion": "neuron.aws.com/v1alphav1", "kind": "UltraServerConfig", "ultraserverMode": 4},
     r"apiVersion 'neuron.aws.com/v1alphav1' is not supported"),
    ({**GOOD, "kind": "GpuConfig"}, r"kind 'GpuConfig' is not supported; use 'NeuronConfig' or 'UltraServerConfig'"),
    ({**GOOD, "apiVersion": "neuron.aws.com/v1alphav1"}, r"apiVersion 'neuron.aws.com/v1alphav1' is not supported"),
    ({"kind": "NeuronConfig"}, r"apiVersion None"),
    ({**GOOD, "logicalNeuronCore": 4}, r"logicalNeuronCore must be 1 or 2, got 4"),
    ({**GOOD, "logicalNeuronCore": "1"}, r"logicalNeuronCore must be 1 or 2, got '1'"),
    ({**GOOD, "logicalNeuronCore": True}, r"logicalNeuronCore must be 1 or 2, got True"),
    ([1, 2], r"parameters must be an object"),
    ("{not json", r"parameters must be an object, got a string"),
])
def test_bad_configs_name_the_problem(params: Any, pattern: str) -> None:
    with pytest.raises(ConfigError, match=pattern):
        decode_parameters(params, "config[0]")


def test_claim_configs_win_over_class_configs_whatever_the_order() -> None:
    entries = [
        entry("FromClaim", {**GOOD, "logicalNeuronCore": 1}),
        entry("FromClass", {**GOOD, "logicalNeuronCore": 2}),
    ]
    assert configs(NeuronProfile(), entries, ["neurons"]) == {"neurons": NeuronConfig(1)}
    # within one source the later entry wins; a config without the field keeps the earlier value
    entries = [entry("FromClaim", {**GOOD, "logicalNeuronCore": 2}),
               entry("FromClaim", {**GOOD, "logicalNeuronCore": 1}),
               entry("FromClaim", {"apiVersion": "neuron.aws.com/v1", "kind": "NeuronConfig"})]
    assert configs(NeuronProfile(), entries, ["r"])["r"] == NeuronConfig(1)


def test_request_scoping_and_other_drivers() -> None:
    entries = [
        entry("FromClaim", {**GOOD, "logicalNeuronCore": 1}, requests=("a",)),
        entry("FromClaim", {"anything": "goes"}, driver="efa.networking.k8s.aws"),
    ]
    out = configs(NeuronProfile(), entries, ["a", "b", "a/sub"])
    assert out == {"a": NeuronConfig(1), "b": NeuronConfig(), "a/sub": NeuronConfig(1)}


def test_error_names_the_position_and_source() -> None:
    entries = [entry("FromClass", GOOD), entry("FromClaim", {**GOOD, "extra": 1}, requests=("neurons",))]
    with pytest.raises(ConfigError, match=r"config\[1\] \(FromClaim, requests neurons\).*unknown field 'extra'"):
        configs(NeuronProfile(), entries, ["other"])  # decoded even though it does not apply: strict
