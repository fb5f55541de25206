"""The library chart's device-plugin block, "accel-dra.devicePlugin" (charts/accel-dra-lib/templates/_deviceplugin.tpl):
a device plugin's chart is one include with its block, the library's defaults fill the rest. Paths are the kubelet's
(its device-plugins directory, plugins registry, PodResources and per-driver plugin directories below its root)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from chart_render import EFA_CHART, REPO, Rendered, container, env_of, mounts_of, template

pytestmark = pytest.mark.gotools  # helm, built from Go (the shared fixture in tests/e2e/conftest.py)
LIBRARY = REPO / "charts" / "accel-dra-lib"
BLOCK = """{{- include "accel-dra.devicePlugin" (dict "root" $ "d" (dict
  "namespace" "widgets" "labels" "app.kubernetes.io/part-of: widget" "selectorLabels" "app: widget-plugin"
  "names" (dict "daemonSet" "widget-plugin" "serviceAccount" "widget-plugin" "container" "widget")
  "command" "widget-device-plugin" "image" "example.com/widget:1" "draDriverName" "widget.example.com"
  "nodeEvents" .Values.nodeEvents "config" (dict "metrics" (dict "enabled" true "port" 9999)) "hostMounts" (list))) }}
"""


def widget_chart(tmp_path: Path) -> Path:
    chart = tmp_path / "widget"
    (chart / "templates").mkdir(parents=True)
    shutil.copytree(LIBRARY, chart / "charts" / "accel-dra-lib")  # what helm dependency build puts there
    (chart / "Chart.yaml").write_text("apiVersion: v2\nname: widget\nversion: 0.0.1\n")
    shutil.copy(EFA_CHART / "values.yaml", chart / "values.yaml")  # the top-level settings the charts share
    (chart / "templates" / "plugin.yaml").write_text(BLOCK)
    return chart


def objects(r: Rendered) -> set[tuple[str, str | None, str]]:
    return {(d["kind"], d["metadata"].get("namespace"), d["metadata"]["name"]) for d in r}


def test_a_device_plugin_is_a_block_and_one_include(helm: Path, tmp_path: Path) -> None:
    r = template(helm, widget_chart(tmp_path), "--set", "nodeEvents=false", release="w")
    assert objects(r) == {("ServiceAccount", "widgets", "widget-plugin"), ("DaemonSet", "widgets", "widget-plugin")}
    ds = r.get("DaemonSet", "widget-plugin")
    c = container(ds)
    assert c["command"] == ["widget-device-plugin", "serve"] and env_of(c)["METRICS_PORT"] == "9999"
    assert c["securityContext"]["capabilities"] == {"drop": ["ALL"]} and c["securityContext"]["readOnlyRootFilesystem"]
    assert mounts_of(ds) == {
        "/var/lib/kubelet/device-plugins": {"host": "/var/lib/kubelet/device-plugins", "type": "Directory",
                                            "readOnly": False},
        "/var/lib/kubelet/plugins_registry": {"host": "/var/lib/kubelet/plugins_registry",
                                              "type": "DirectoryOrCreate", "readOnly": True},
        "/var/lib/kubelet/plugins/widget.example.com": {"host": "/var/lib/kubelet/plugins/widget.example.com",
                                                        "type": "DirectoryOrCreate", "readOnly": True},
        "/var/lib/kubelet/pod-resources": {"host": "/var/lib/kubelet/pod-resources", "type": "DirectoryOrCreate",
                                           "readOnly": True},
        "/tmp": {"host": None, "type": None, "readOnly": False},
    }
    assert ds["spec"]["template"]["spec"]["automountServiceAccountToken"] is False  # no Node events: no token


def test_node_events_get_a_token_and_a_role_for_events_in_default(helm: Path, tmp_path: Path) -> None:
    r = template(helm, widget_chart(tmp_path), "--set", "nodeEvents=true", release="w")
    assert ("Role", "default", "widget-plugin-node-events") in objects(r)
    role = r.get("Role", "widget-plugin-node-events")
    assert role["rules"] == [{"apiGroups": [""], "resources": ["events"], "verbs": ["create"]}]
    assert r.get("DaemonSet", "widget-plugin")["spec"]["template"]["spec"]["automountServiceAccountToken"] is True
