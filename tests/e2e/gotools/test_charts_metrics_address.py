"""Issue 14 item 5 in the charts: every metrics endpoint listens on the address the chart passes (the pod IP from the
downward API by default), never on every host interface; the daemons accept what the charts render."""

from __future__ import annotations

from pathlib import Path

import pytest
from chart_render import EFA_CHART, NEURON_CHART, RenderError, container, env_of, run_helm, template

from efa_plugin import cli as efa_cli

POD_IP = {"fieldRef": {"fieldPath": "status.podIP"}}
HOST_IP = {"fieldRef": {"fieldPath": "status.hostIP"}}
DRA_ON = ["--set", "devicePlugin.enabled=false", "--set", "draDriver.enabled=true"]
# (chart, flags, DaemonSet, values prefix of its metrics block)
DAEMONS = [
    (EFA_CHART, [], "aws-efa-k8s-device-plugin-daemonset", "metrics"),
    (EFA_CHART, DRA_ON, "aws-efa-k8s-device-plugin-dra-driver", "draDriver.metrics"),
    (NEURON_CHART, [], "neuron-device-plugin", "devicePlugin.metrics"),
    (NEURON_CHART, DRA_ON, "neuron-dra-driver-kubelet-plugin", "draDriver.metrics"),
]


pytestmark = pytest.mark.gotools  # helm, built from Go (the shared fixture in tests/e2e/conftest.py)


@pytest.mark.parametrize(("chart", "flags", "ds", "prefix"), DAEMONS)
def test_pod_ip_by_default_host_ip_or_literal_on_request(helm: Path, chart: Path, flags: list[str], ds: str,
                                                          prefix: str) -> None:
    env = env_of(container(template(helm, chart, *flags).get("DaemonSet", ds)))
    assert env["METRICS_ADDRESS"] == POD_IP
    env = env_of(container(template(helm, chart, *flags, "--set", f"{prefix}.address=hostIP").get("DaemonSet", ds)))
    assert env["METRICS_ADDRESS"] == HOST_IP
    env = env_of(container(template(helm, chart, *flags, "--set", f"{prefix}.address=127.0.0.1").get("DaemonSet", ds)))
    assert env["METRICS_ADDRESS"] == "127.0.0.1"
    env = env_of(container(template(helm, chart, *flags, "--set", f"{prefix}.enabled=false").get("DaemonSet", ds)))
    assert env["METRICS_PORT"] == "0" and "METRICS_ADDRESS" not in env


def test_host_network_plugins_do_not_open_every_host_interface(helm: Path) -> None:
    """With hostNetwork the pod IP is the node's IP: one interface, not 0.0.0.0."""
    for chart, flags, ds, _ in (DAEMONS[0], DAEMONS[2]):
        rendered = template(helm, chart, *flags).get("DaemonSet", ds)
        assert rendered["spec"]["template"]["spec"]["hostNetwork"] is True
        assert env_of(container(rendered))["METRICS_ADDRESS"] == POD_IP


def test_node_problem_detector_follows_its_address(helm: Path) -> None:
    c = container(template(helm, NEURON_CHART).get("DaemonSet", "node-problem-detector"))
    assert "--prometheus-address=$(METRICS_ADDRESS)" in c["args"]  # expanded by the kubelet from the env below
    assert env_of(c)["METRICS_ADDRESS"] == POD_IP


@pytest.mark.parametrize(("chart", "key"), [(EFA_CHART, "metrics.address"),
                                            (NEURON_CHART, "devicePlugin.metrics.address"),
                                            (NEURON_CHART, "npd.metrics.address")])
@pytest.mark.parametrize("bad", ["anywhere", "localhost", "10.0.0.1:9810", "podip"])
def test_schema_rejects_what_is_not_an_address(helm: Path, chart: Path, key: str, bad: str) -> None:
    with pytest.raises(RenderError, match="address"):
        template(helm, chart, "--set", f"{key}={bad}")


@pytest.mark.parametrize("address", ["podIP", "hostIP", "0.0.0.0", "::", "fd00::1"])
def test_charts_lint_with_every_address_form(helm: Path, address: str) -> None:
    assert "0 chart(s) failed" in run_helm(helm, ["lint", "--strict", str(EFA_CHART), "--set",
                                                  f"metrics.address={address}"])
    assert "0 chart(s) failed" in run_helm(helm, ["lint", "--strict", str(NEURON_CHART), "--set",
                                                  f"devicePlugin.metrics.address={address}"])


@pytest.mark.parametrize("literal", ["127.0.0.1", "10.1.2.3", "::", "fd00::1"])
def test_the_daemon_takes_the_literal_the_chart_renders(helm: Path, literal: str,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    env = env_of(container(template(helm, EFA_CHART, "--set", f"metrics.address={literal}").get(
        "DaemonSet", "aws-efa-k8s-device-plugin-daemonset")))
    monkeypatch.setenv("METRICS_ADDRESS", env["METRICS_ADDRESS"])
    monkeypatch.setenv("METRICS_PORT", env["METRICS_PORT"])
    args = efa_cli.build_parser().parse_args(["serve"])
    assert (args.metrics_address, args.metrics_port) == (literal, 9810)
