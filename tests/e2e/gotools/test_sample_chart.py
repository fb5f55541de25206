"""The sample accelerator's chart (tests/sample_accelerator/chart): its two blocks on the library chart. Expected
paths are the kubelet's (reference: the device-plugins directory and PodResources socket below the kubelet root) and
the sample's declaration (its console scripts, resource, driver name, metrics port), not read from the library."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from chart_render import REPO, RenderError, container, env_of, mounts_of, node_terms, template

pytestmark = pytest.mark.gotools  # helm, built from Go (the shared fixture in tests/e2e/conftest.py)
CHART = REPO / "tests" / "sample_accelerator" / "chart"


@pytest.fixture(scope="module", autouse=True)
def library() -> None:
    """The chart's file:// dependency in its charts/, as helm dependency build would put it."""
    subprocess.run([str(REPO / "scripts" / "chart-deps.sh"), str(CHART)], check=True, timeout=60)


def test_the_sample_chart_is_its_blocks(helm: Path) -> None:
    r = template(helm, CHART, "--namespace", "sacc", "--set", "draDriver.enabled=true", release="s")
    kinds = r.kinds()
    assert kinds["DaemonSet"] == {"sacc-device-plugin", "sacc-dra-driver"}
    assert kinds["DeviceClass"] == {"sacc.example.com"}
    assert {"sacc-device-plugin", "sacc-dra-driver"} <= kinds["ServiceAccount"]
    assert "sacc-device-plugin-node-events" in kinds["Role"]
    only_plugin = template(helm, CHART, "--namespace", "sacc", release="s")
    assert only_plugin.names("DaemonSet") == {"sacc-device-plugin"} and not only_plugin.all("DeviceClass")


def test_the_device_plugin_daemonset(helm: Path) -> None:
    r = template(helm, CHART, "--namespace", "sacc", "--set", "fakeHost.path=/var/lib/accel-fake-host", release="s")
    ds = r.get("DaemonSet", "sacc-device-plugin")
    c = container(ds)
    assert c["command"] == ["sample-device-plugin", "serve", "--host-root", "/var/lib/accel-fake-host"]
    assert c["image"] == "example.local/aws-accel-agents-sample:0.1.0"
    env = env_of(c)
    assert env["DEVICE_PLUGINS_DIR"] == "/var/lib/kubelet/device-plugins" and env["METRICS_PORT"] == "9830"
    assert env["NODE_NAME"] == {"fieldRef": {"fieldPath": "spec.nodeName"}}
    mounts = mounts_of(ds)
    assert mounts["/var/lib/kubelet/device-plugins"] == {"host": "/var/lib/kubelet/device-plugins",
                                                         "type": "Directory", "readOnly": False}
    assert mounts["/var/lib/kubelet/plugins/sacc.example.com"]["readOnly"]  # the DRA driver's presence: read only
    assert mounts["/var/lib/kubelet/pod-resources"]["readOnly"] and mounts["/dev"]["readOnly"]
    assert mounts["/var/lib/accel-fake-host"] == {"host": "/var/lib/accel-fake-host", "type": "Directory",
                                                  "readOnly": True}
    spec = ds["spec"]["template"]["spec"]
    assert spec["automountServiceAccountToken"] is True  # the Node events it posts
    assert c["securityContext"]["readOnlyRootFilesystem"] and c["securityContext"]["capabilities"]["drop"] == ["ALL"]
    assert c["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "metrics"}
    assert [e for e in node_terms(ds)[0] if e["key"] == "node.kubernetes.io/instance-type"] == \
        [{"key": "node.kubernetes.io/instance-type", "operator": "In", "values": ["sacc.8xlarge"]}]


def test_migration_label_splits_the_node_between_the_two_sides(helm: Path) -> None:
    """nodeSelection.driverLabel: the DRA driver where the label is "dra", the device plugin everywhere else."""
    r = template(helm, CHART, "--set", "draDriver.enabled=true",
                 "--set", "nodeSelection.driverLabel=example.com/sacc-mode", release="s")
    op = {name: next(e["operator"] for e in node_terms(r.get("DaemonSet", name))[0]
                     if e["key"] == "example.com/sacc-mode") for name in ("sacc-device-plugin", "sacc-dra-driver")}
    assert op == {"sacc-device-plugin": "NotIn", "sacc-dra-driver": "In"}


def test_metrics_off_means_no_port_and_no_readiness_probe(helm: Path) -> None:
    r = template(helm, CHART, "--set", "devicePlugin.metrics.enabled=false", release="s")
    c = container(r.get("DaemonSet", "sacc-device-plugin"))
    assert env_of(c)["METRICS_PORT"] == "0" and "ports" not in c and "readinessProbe" not in c


@pytest.mark.parametrize(("flag", "where"), [
    ("devicePlugin.enabled=yes", "/devicePlugin/enabled"),
    ("devicePlugin.metrics.port=70000", "/devicePlugin/metrics/port"),
    ("logLevel=LOUD", "/logLevel"), ("kubeletRootDir=var/lib", "/kubeletRootDir")])
def test_its_values_schema_refuses_bad_values(helm: Path, flag: str, where: str) -> None:
    with pytest.raises(RenderError) as err:
        template(helm, CHART, "--set", flag, release="s")
    assert where in str(err.value)
