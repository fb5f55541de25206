"""Both charts take their DRA parts from the library chart charts/accel-dra-lib, and what they render did not change:
the seeds' install commands give the objects the AWS guides name, with the names, namespaces, paths and environment
written here from the guides and the kubelet/CDI facts (../shared/reference), not read from the library."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from chart_render import (
    EFA_CHART,
    NEURON_CHART,
    REPO,
    SEED_DEVICE_PLUGIN_INSTALL,
    SEED_DRA_INSTALL,
    Rendered,
    container,
    env_of,
    mounts_of,
    parse,
    run_helm,
    seed_as_template,
    template,
)

LIBRARY = REPO / "charts" / "accel-dra-lib"
DRA_ON = ("--set", "devicePlugin.enabled=false", "--set", "draDriver.enabled=true")


pytestmark = pytest.mark.gotools  # helm, built from Go (the shared fixture in tests/e2e/conftest.py)


def objects(r: Rendered) -> set[tuple[str, str | None, str]]:
    return {(d["kind"], d["metadata"].get("namespace"), d["metadata"]["name"]) for d in r}


def test_the_charts_depend_on_the_library_as_a_local_dependency() -> None:
    """Each chart declares the library as the file:// dependency; scripts/chart-deps.sh (make setup, every pytest
    run) copies it into charts/<chart>/charts/ as helm dependency build would, and git ignores the copy: nothing there
    is committed, least of all a symlink (helm warns on every command about those)."""
    assert yaml.safe_load((LIBRARY / "Chart.yaml").read_text())["type"] == "library"
    tracked = subprocess.run(["git", "-C", str(REPO), "ls-files", "-s", "--", "charts/*/charts"], capture_output=True,
                             text=True, check=True).stdout
    assert tracked == "", f"committed under a chart's charts/: {tracked}"
    for chart in (NEURON_CHART, EFA_CHART):
        deps = yaml.safe_load((chart / "Chart.yaml").read_text())["dependencies"]
        assert deps == [{"name": "accel-dra-lib", "version": "0.1.0", "repository": "file://../accel-dra-lib"}]
        copy = chart / "charts" / "accel-dra-lib"
        assert copy.is_dir() and not copy.is_symlink()
        assert subprocess.run(["diff", "-r", str(LIBRARY), str(copy)], capture_output=True).returncode == 0
        assert not list((chart / "templates").rglob("*admission*")), "the chart keeps no DRA template of its own"


def test_seed_dra_install_objects(helm: Path) -> None:
    """The guide's DRA install: DaemonSet neuron-dra-driver-kubelet-plugin in neuron-dra-driver and DeviceClass
    neuron.aws.com, with the driver's account, role, own-node policy and metrics Service beside them."""
    r = parse(run_helm(helm, seed_as_template(SEED_DRA_INSTALL, NEURON_CHART)))
    ns = "neuron-dra-driver"
    assert objects(r) == {
        ("ServiceAccount", ns, "neuron-dra-driver-sa"),
        ("ClusterRole", None, "neuron-dra-driver"),
        ("ClusterRoleBinding", None, "neuron-dra-driver"),
        ("Service", ns, "neuron-dra-driver-metrics"),
        ("DaemonSet", ns, "neuron-dra-driver-kubelet-plugin"),
        # it reads that one DaemonSet at shutdown: uninstalled (leave the node to the device plugin) or restarting?
        ("Role", ns, "neuron-dra-driver-kubelet-plugin-own-daemonset"),
        ("RoleBinding", ns, "neuron-dra-driver-kubelet-plugin-own-daemonset"),
        # the pre-delete hook: deletes the DaemonSet first so each driver leaves its node cleanly on uninstall
        ("ServiceAccount", ns, "neuron-dra-driver-kubelet-plugin-handoff"),
        ("Role", ns, "neuron-dra-driver-kubelet-plugin-handoff"),
        ("RoleBinding", ns, "neuron-dra-driver-kubelet-plugin-handoff"),
        ("Job", ns, "neuron-dra-driver-kubelet-plugin-handoff"),
        ("DeviceClass", None, "neuron.aws.com"),
        ("ValidatingAdmissionPolicy", None, "neuron-dra-driver-resourceslices"),
        ("ValidatingAdmissionPolicyBinding", None, "neuron-dra-driver-resourceslices"),
        ("ValidatingAdmissionPolicy", None, "neuron-own-node-keys.neuron-dra-driver.neuron-helm-chart"),
        ("ValidatingAdmissionPolicyBinding", None, "neuron-own-node-keys.neuron-dra-driver.neuron-helm-chart"),
    }
    policy = r.get("ValidatingAdmissionPolicy", "neuron-dra-driver-resourceslices")
    assert policy["spec"]["matchConditions"] == [{
        "name": "neuron-dra-driver-only",
        "expression": 'request.userInfo.username == "system:serviceaccount:neuron-dra-driver:neuron-dra-driver-sa"'}]
    assert "variables.sliceDriver == 'neuron.aws.com'" in [v["expression"] for v in policy["spec"]["validations"]]
    binding = r.get("ClusterRoleBinding", "neuron-dra-driver")
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "neuron-dra-driver-sa", "namespace": ns}]
    assert r.get("DeviceClass", "neuron.aws.com")["spec"] == {
        "selectors": [{"cel": {"expression": 'device.driver == "neuron.aws.com"'}}]}


def test_seed_device_plugin_install_has_no_dra_part(helm: Path) -> None:
    r = parse(run_helm(helm, seed_as_template(SEED_DEVICE_PLUGIN_INSTALL, NEURON_CHART)))
    assert ("DaemonSet", "kube-system", "neuron-device-plugin") in objects(r)
    assert not r.all("DeviceClass") and "neuron-dra-driver-sa" not in r.names("ServiceAccount")


#: What every DRA DaemonSet's container reads (README "Configuration"; kubelet-apis.md: the kubelet's
#: plugins_registry and plugins directories below its root; CDI facts: /var/run/cdi is the dynamic spec directory).
COMMON_ENV = {
    "KUBELET_ROOT": "/var/lib/kubelet",
    "DEVICE_PLUGINS_DIR": "/var/lib/kubelet/device-plugins",
    "CDI_ROOT": "/var/run/cdi",
    "KUBELET_REGISTRAR_DIRECTORY_PATH": "/var/lib/kubelet/plugins_registry",
    "KUBELET_PLUGINS_DIRECTORY_PATH": "/var/lib/kubelet/plugins",
    "REGISTRATION_WAIT": "30",
    "DEVICE_STATUS": "on",
    "DEVICE_METADATA": "on",  # KEP-5304 device metadata files: draDriver.deviceMetadata.enabled, on by default
    "UNHEALTHY_TAINT_EFFECT": "NoSchedule",
    "UNHEALTHY_NOEXECUTE_AFTER": "30",
    "LOG_LEVEL": "INFO",
    "LOG_FORMAT": "kv",
    "NODE_NAME": {"fieldRef": {"fieldPath": "spec.nodeName"}},
    "POD_UID": {"fieldRef": {"fieldPath": "metadata.uid"}},
    "POD_NAMESPACE": {"fieldRef": {"fieldPath": "metadata.namespace"}},
}
COMMON_MOUNTS = {
    "/var/lib/kubelet/plugins_registry": {"host": "/var/lib/kubelet/plugins_registry", "type": "Directory",
                                          "readOnly": False},
    "/var/lib/kubelet/plugins": {"host": "/var/lib/kubelet/plugins", "type": "Directory", "readOnly": False},
    "/var/run/cdi": {"host": "/var/run/cdi", "type": "DirectoryOrCreate", "readOnly": False},
    "/tmp": {"host": None, "type": None, "readOnly": False},
    # PodResources: devices pods hold through the device plugin stay out of the slices until those pods end
    "/var/lib/kubelet/pod-resources": {"host": "/var/lib/kubelet/pod-resources", "type": "DirectoryOrCreate",
                                       "readOnly": True},
}

#: chart, flags, DaemonSet, namespace, container, command, metrics port and health port (README), driver's own
#: mounts (the devices its CDI specs name: /dev/neuronN, /dev/infiniband/uverbsN).
DRIVERS: list[tuple[Path, tuple[str, ...], str, str, str, str, int, int, dict[str, dict[str, Any]]]] = [
    (NEURON_CHART, (*DRA_ON, "--set", "npd.enabled=false"), "neuron-dra-driver-kubelet-plugin", "neuron-dra-driver",
     "neuron-dra-driver", "neuron-dra-driver", 9812, 51515, {
         "/var/lib/kubelet/device-plugins": {"host": "/var/lib/kubelet/device-plugins", "type": "Directory",
                                             "readOnly": True},
         "/opt/aws": {"host": "/opt/aws", "type": "DirectoryOrCreate", "readOnly": True},
         "/dev": {"host": "/dev", "type": "Directory", "readOnly": True}}),
    (EFA_CHART, DRA_ON, "aws-efa-k8s-device-plugin-dra-driver", "kube-system", "efa-dra-driver", "efa-dra-driver",
     9813, 51516, {
         "/var/lib/kubelet/device-plugins": {"host": "/var/lib/kubelet/device-plugins", "type": "DirectoryOrCreate",
                                             "readOnly": True},
         "/dev/infiniband": {"host": "/dev/infiniband", "type": "DirectoryOrCreate", "readOnly": True}}),
]


@pytest.mark.parametrize("chart, flags, name, namespace, cname, command, metrics, health, own", DRIVERS,
                         ids=["neuron", "efa"])
def test_dra_daemonset_pinned(helm: Path, chart: Path, flags: tuple[str, ...], name: str, namespace: str,
                              cname: str, command: str, metrics: int, health: int,
                              own: dict[str, dict[str, Any]]) -> None:
    r = template(helm, chart, "--namespace", "kube-system", *flags)
    ds = r.get("DaemonSet", name)
    assert ds["metadata"]["namespace"] == namespace
    c = container(ds)
    assert c["name"] == cname and c["command"] == [command, "serve"]
    assert env_of(c) == {**COMMON_ENV, "METRICS_PORT": str(metrics), "HEALTHCHECK_PORT": str(health),
                         "METRICS_ADDRESS": {"fieldRef": {"fieldPath": "status.podIP"}}, "DAEMONSET_NAME": name}
    assert mounts_of(ds) == {**COMMON_MOUNTS, **own}
    assert c["livenessProbe"]["grpc"] == {"port": health, "service": "liveness"}
    assert {p["name"]: p["containerPort"] for p in c["ports"]} == {"healthz": health, "metrics": metrics}
    spec = ds["spec"]["template"]["spec"]
    assert spec["serviceAccountName"] in r.names("ServiceAccount")
    assert ds["spec"]["selector"]["matchLabels"].items() <= ds["spec"]["template"]["metadata"]["labels"].items()
    prefix = name.removesuffix("-kubelet-plugin")
    service = next(s for s in r.all("Service") if s["metadata"]["name"].startswith(prefix))
    assert service["spec"]["selector"] == ds["spec"]["selector"]["matchLabels"]


def test_a_new_driver_is_a_block_and_one_include(helm: Path, tmp_path: Path) -> None:
    """A third driver's chart: values, one template with its block, and the library as its dependency."""
    chart = tmp_path / "widget"
    (chart / "templates").mkdir(parents=True)
    shutil.copytree(LIBRARY, chart / "charts" / "accel-dra-lib")  # what helm dependency build puts there
    (chart / "Chart.yaml").write_text("apiVersion: v2\nname: widget\nversion: 0.0.1\ndependencies:\n"
                                      "  - {name: accel-dra-lib, version: 0.1.0, repository: file://../accel-dra-lib}\n")
    shutil.copy(EFA_CHART / "values.yaml", chart / "values.yaml")  # the top-level settings both charts share
    (chart / "templates" / "driver.yaml").write_text("""{{- include "accel-dra.driver" (dict "root" $ "d" (dict
  "driverName" "widget.example.com" "displayName" "Widget" "namespace" .Release.Namespace
  "labels" "app.kubernetes.io/part-of: widget" "selectorLabels" "app: widget-dra"
  "names" (dict "daemonSet" "widget-dra" "serviceAccount" "widget-dra" "clusterRole" "widget-dra"
                "policy" "widget-dra-slices" "metricsService" "widget-dra-metrics" "deviceClass" "widget.example.com"
                "container" "widget")
  "command" "widget-dra-driver" "image" "example.com/widget:1" "nodeVerbs" (list "get")
  "config" .Values.draDriver "pod" (pick .Values "priorityClassName" "securityContext")
  "devicePluginsDirType" "DirectoryOrCreate" "hostMounts" (list))) }}
""")
    r = template(helm, chart, "--namespace", "widgets", release="w")
    assert objects(r) == {
        ("ServiceAccount", "widgets", "widget-dra"), ("ClusterRole", None, "widget-dra"),
        ("ClusterRoleBinding", None, "widget-dra"), ("ValidatingAdmissionPolicy", None, "widget-dra-slices"),
        ("ValidatingAdmissionPolicyBinding", None, "widget-dra-slices"), ("DeviceClass", None, "widget.example.com"),
        ("Service", "widgets", "widget-dra-metrics"), ("DaemonSet", "widgets", "widget-dra"),
        ("Role", "widgets", "widget-dra-own-daemonset"), ("RoleBinding", "widgets", "widget-dra-own-daemonset"),
        ("ServiceAccount", "widgets", "widget-dra-handoff"), ("Role", "widgets", "widget-dra-handoff"),
        ("RoleBinding", "widgets", "widget-dra-handoff"), ("Job", "widgets", "widget-dra-handoff"),
    }
    assert container(r.get("DaemonSet", "widget-dra"))["command"] == ["widget-dra-driver", "serve"]
