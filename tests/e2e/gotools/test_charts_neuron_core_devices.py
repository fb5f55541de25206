"""The Neuron chart's NeuronCore devices (``draDriver.coreDevices.enabled``): off by default with today's DeviceClass;
on, the driver gets ``CORE_DEVICES=on``, DeviceClass ``neuroncore.aws.com`` selects the core devices (with
``extendedResourceName: aws.amazon.com/neuroncore`` under ``draDriver.extendedResource``) and ``neuron.aws.com``
leaves them out, with the selectors the driver's module names (the bench and e2e tests use those)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from chart_render import NEURON_CHART, RenderError, template

from neuron_dra.dra import cores

pytestmark = pytest.mark.gotools  # helm, built from Go (the shared fixture in tests/e2e/conftest.py)


def classes(helm: Path, *flags: str) -> tuple[dict[str, dict[str, Any]], list[dict[str, Any]]]:
    out = template(helm, NEURON_CHART, "--set", "draDriver.enabled=true", "--set", "devicePlugin.enabled=false",
                   "--set", "npd.enabled=false", *flags)
    docs = out.docs
    klasses = {d["metadata"]["name"]: d["spec"] for d in docs if d["kind"] == "DeviceClass"}
    (ds,) = [d for d in docs if d["kind"] == "DaemonSet"]
    return klasses, ds["spec"]["template"]["spec"]["containers"][0]["env"]


def test_chart_off_by_default_keeps_todays_class(helm: Path) -> None:
    klasses, env = classes(helm)
    assert klasses == {"neuron.aws.com": {"selectors": [{"cel": {"expression": cores.PLAIN_CLASS_SELECTOR}}]}}
    assert "CORE_DEVICES" not in {e["name"] for e in env}


def test_chart_on_adds_neuroncore_class_and_keeps_cores_out_of_neuron_class(helm: Path) -> None:
    klasses, env = classes(helm, "--set", "draDriver.coreDevices.enabled=true", "--set",
                           "draDriver.extendedResource=true", "--set", "draDriver.extraEnv[0].name=X",
                           "--set", "draDriver.extraEnv[0].value=y")
    assert klasses == {
        "neuron.aws.com": {"extendedResourceName": "aws.amazon.com/neuron",
                           "selectors": [{"cel": {"expression": cores.CHIP_CLASS_SELECTOR}}]},
        "neuroncore.aws.com": {"extendedResourceName": "aws.amazon.com/neuroncore",
                               "selectors": [{"cel": {"expression": cores.CORE_CLASS_SELECTOR}}]}}
    assert [e for e in env if e["name"] in ("CORE_DEVICES", "X")] == [{"name": "X", "value": "y"},
                                                                      {"name": "CORE_DEVICES", "value": "on"}]


def test_chart_schema_refuses_a_misspelt_core_devices_key(helm: Path) -> None:
    with pytest.raises(RenderError, match="additional properties 'enable' not allowed"):
        classes(helm, "--set", "draDriver.coreDevices.enable=true")


def test_chart_core_devices_per_node_pool(helm: Path) -> None:
    _, env = classes(helm, "--set", "draDriver.coreDevices.enabled=true",
                     "--set", "draDriver.coreDevices.labelledNodesOnly=true")
    assert [e for e in env if e["name"] == "CORE_DEVICES"] == [{"name": "CORE_DEVICES", "value": "node-label"}]
    _, env = classes(helm, "--set", "draDriver.coreDevices.labelledNodesOnly=true")
    assert "CORE_DEVICES" not in {e["name"] for e in env}  # not enabled: nothing
