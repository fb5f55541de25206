"""Render tests for charts/neuron-helm-chart and charts/aws-efa-k8s-device-plugin.

``helm template`` and ``helm lint --strict`` run on the exact command lines of the AWS documents (seeds) and on every
component toggle; the assertions are on the parsed objects.
"""

from __future__ import annotations

import itertools
import json
import re
from pathlib import Path
from typing import Any

import pytest
from chart_render import (
    EFA_CHART,
    NEURON_CHART,
    SEED_DEVICE_PLUGIN_INSTALL,
    SEED_DRA_INSTALL,
    Rendered,
    RenderError,
    container,
    env_of,
    find_or_build_helm,
    mounts_of,
    node_matches,
    node_terms,
    parse,
    run_helm,
    seed_as_template,
    template,
)

from accel_core.awsfacts import catalog
from neuron_dra.facts.ultraserver import NODE_LABELS

DRA_DS = "neuron-dra-driver-kubelet-plugin"
DP_DS = "neuron-device-plugin"
NPD_DS = "node-problem-detector"
EFA_DS = "aws-efa-k8s-device-plugin-daemonset"
NAMESPACED = {"DaemonSet", "ServiceAccount", "Service", "ConfigMap", "ServiceMonitor"}
#: What a DRA driver of this project calls: GET one claim, GET its Node, and list/watch/create/update/delete its
#: node's slices (accel_core/dra/claims.py and publisher.py). Nothing more may be granted.
BASE_DRA_DRIVER_RULES = {
    (("resource.k8s.io",), ("resourceclaims",), ()): {"get"},
    (("",), ("nodes",), ()): {"get", "watch"},  # watch: its own Node's topology labels
    (("resource.k8s.io",), ("resourceslices",), ()): {"list", "watch", "create", "update", "delete"},
    (("events.k8s.io",), ("events",), ()): {"create", "patch"},  # accel_core/dra/reporter.py: claim problems
}


def device_status_rules(driver: str) -> dict[tuple[tuple[str, ...], ...], set[str]]:
    """What the API server asks for a status.devices write (k8s.io/kubernetes v1.37 pkg/registry/resource:
    AuthorizedForDeviceStatus): patch on resourceclaims/status, and on the synthetic resourceclaims/driver
    subresource named by the driver the associated-node: form of the verb (the driver's token is pod-bound)."""
    return {(("resource.k8s.io",), ("resourceclaims/status",), ()): {"patch"},
            (("resource.k8s.io",), ("resourceclaims/driver",), (driver,)): {"associated-node:patch"}}


DRA_DRIVER_RULES = {**BASE_DRA_DRIVER_RULES, **device_status_rules("efa.aws.com")}
#: The Neuron DRA driver also patches its own Node (the UltraServer labels; own-node-policy.yaml limits it).
NEURON_DRA_DRIVER_RULES = {**BASE_DRA_DRIVER_RULES, (("",), ("nodes",), ()): {"get", "watch", "patch"},
                           **device_status_rules("neuron.aws.com")}
EFA_DRA_DS = "aws-efa-k8s-device-plugin-dra-driver"
EFA_DRA_ON = ["--set", "devicePlugin.enabled=false", "--set", "draDriver.enabled=true"]


@pytest.fixture(scope="session")
def helm() -> Path:
    return find_or_build_helm()


@pytest.fixture(scope="session")
def seed_dra(helm: Path) -> Rendered:
    return parse(run_helm(helm, seed_as_template(SEED_DRA_INSTALL, NEURON_CHART)))


@pytest.fixture(scope="session")
def seed_device_plugin(helm: Path) -> Rendered:
    return parse(run_helm(helm, seed_as_template(SEED_DEVICE_PLUGIN_INSTALL, NEURON_CHART)))


@pytest.fixture(scope="session")
def neuron_defaults(helm: Path) -> Rendered:
    return template(helm, NEURON_CHART)


@pytest.fixture(scope="session")
def efa_defaults(helm: Path) -> Rendered:
    return template(helm, EFA_CHART, release="aws-efa-k8s-device-plugin")


def assert_namespaced(rendered: Rendered) -> None:
    """Every namespaced object names its namespace (the chart places objects outside the release namespace)."""
    for doc in rendered:
        if doc["kind"] in NAMESPACED:
            assert doc["metadata"].get("namespace"), f"{doc['kind']} {doc['metadata']['name']} has no namespace"


# --------------------------------------------------------------------------------------------------------------------
# Neuron chart: the seed's DRA install


def test_seed_dra_install_gives_the_documented_objects(seed_dra: Rendered) -> None:
    assert seed_dra.names("DaemonSet") == {DRA_DS}
    ds = seed_dra.get("DaemonSet", DRA_DS)
    assert ds["metadata"]["namespace"] == "neuron-dra-driver"
    dc = seed_dra.get("DeviceClass", "neuron.aws.com")
    assert dc["apiVersion"] == "resource.k8s.io/v1"
    assert dc["spec"]["selectors"] == [{"cel": {"expression": 'device.driver == "neuron.aws.com"'}}]
    # --create-namespace made the namespace; the chart must not template it a second time.
    assert seed_dra.all("Namespace") == []
    assert not {"ConfigMap"} & set(seed_dra.kinds()), "npd.enabled=false still rendered the NPD config"
    assert_namespaced(seed_dra)


def test_seed_dra_install_pod_spec(seed_dra: Rendered) -> None:
    ds = seed_dra.get("DaemonSet", DRA_DS)
    pod = ds["spec"]["template"]["spec"]
    strategy = ds["spec"]["updateStrategy"]
    assert strategy == {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}}
    assert pod["serviceAccountName"] == "neuron-dra-driver-sa"
    assert pod["priorityClassName"] == "system-node-critical"
    assert pod["hostNetwork"] is False  # surge pods share the node: host ports would collide
    c = container(ds)
    assert c["command"] == ["neuron-dra-driver", "serve"]
    env = env_of(c)
    assert env["NODE_NAME"] == {"fieldRef": {"fieldPath": "spec.nodeName"}}
    assert env["POD_UID"] == {"fieldRef": {"fieldPath": "metadata.uid"}}
    assert env["CDI_ROOT"] == "/var/run/cdi"
    assert env["KUBELET_ROOT"] == "/var/lib/kubelet"
    assert env["KUBELET_REGISTRAR_DIRECTORY_PATH"] == "/var/lib/kubelet/plugins_registry"
    assert env["KUBELET_PLUGINS_DIRECTORY_PATH"] == "/var/lib/kubelet/plugins"
    assert env["HEALTHCHECK_PORT"] == "51515"
    assert env["METRICS_PORT"] == "9812"
    probe = c["livenessProbe"]
    assert probe["grpc"] == {"port": 51515, "service": "liveness"}
    assert (probe["initialDelaySeconds"], probe["periodSeconds"], probe["timeoutSeconds"]) == (30, 10, 5)
    assert {p["name"]: p["containerPort"] for p in c["ports"]} == {"healthz": 51515, "metrics": 9812}


def test_seed_dra_install_mounts(seed_dra: Rendered) -> None:
    ds = seed_dra.get("DaemonSet", DRA_DS)
    mounts = mounts_of(ds)
    rw = {"host": None, "type": "Directory", "readOnly": False}
    # Sockets must have the same path inside and outside the container: the kubelet dials the advertised path.
    assert mounts["/var/lib/kubelet/plugins_registry"] == {**rw, "host": "/var/lib/kubelet/plugins_registry"}
    assert mounts["/var/lib/kubelet/plugins"] == {**rw, "host": "/var/lib/kubelet/plugins"}
    assert mounts["/var/run/cdi"] == {"host": "/var/run/cdi", "type": "DirectoryOrCreate", "readOnly": False}
    assert mounts["/var/lib/kubelet/device-plugins"]["readOnly"] is True  # the coexistence guard only looks
    assert mounts["/opt/aws"] == {"host": "/opt/aws", "type": "DirectoryOrCreate", "readOnly": True}
    assert mounts["/dev"] == {"host": "/dev", "type": "Directory", "readOnly": True}
    # A read-only /dev cannot take the default /dev/termination-log mount point.
    assert not container(ds)["terminationMessagePath"].startswith("/dev/")


def test_seed_dra_install_security_context(seed_dra: Rendered) -> None:
    sc = container(seed_dra.get("DaemonSet", DRA_DS))["securityContext"]
    assert sc["privileged"] is False
    assert sc["allowPrivilegeEscalation"] is False
    assert sc["capabilities"] == {"drop": ["ALL"]}
    assert sc["readOnlyRootFilesystem"] is True


def test_seed_dra_install_rbac_is_least_privilege(seed_dra: Rendered) -> None:
    sa = seed_dra.get("ServiceAccount", "neuron-dra-driver-sa")
    assert sa["metadata"]["namespace"] == "neuron-dra-driver"
    role = seed_dra.get("ClusterRole", "neuron-dra-driver")
    granted = {
        (tuple(r["apiGroups"]), tuple(r["resources"]), tuple(r.get("resourceNames", ()))): set(r["verbs"])
        for r in role["rules"]
    }
    assert granted == NEURON_DRA_DRIVER_RULES  # issue 14 item 6; tests/e2e/test_dra_rbac.py proves the rest is refused
    binding = seed_dra.get("ClusterRoleBinding", "neuron-dra-driver")
    assert binding["roleRef"]["name"] == "neuron-dra-driver"
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": "neuron-dra-driver-sa", "namespace": "neuron-dra-driver"}
    ]


def test_seed_dra_install_admission_policy_limits_slices_to_own_node(seed_dra: Rendered) -> None:
    vap = seed_dra.get("ValidatingAdmissionPolicy", "neuron-dra-driver-resourceslices")
    spec = vap["spec"]
    assert spec["failurePolicy"] == "Fail"
    (rule,) = spec["matchConstraints"]["resourceRules"]
    assert rule["resources"] == ["resourceslices"]
    assert set(rule["operations"]) == {"CREATE", "UPDATE", "DELETE"}
    (cond,) = spec["matchConditions"]
    assert cond["expression"] == (
        'request.userInfo.username == "system:serviceaccount:neuron-dra-driver:neuron-dra-driver-sa"'
    )
    variables = {v["name"]: v["expression"] for v in spec["variables"]}
    assert "authentication.kubernetes.io/node-name" in variables["driverNode"]
    assert "object.spec.?nodeName" in variables["newNode"]
    assert "oldObject.spec.?nodeName" in variables["oldNode"]
    checks = [v["expression"] for v in spec["validations"]]
    assert "variables.driverNode != ''" in checks
    assert "variables.sliceDriver == 'neuron.aws.com'" in checks
    assert any("variables.newNode == variables.driverNode" in c for c in checks)
    assert any("variables.oldNode == variables.driverNode" in c for c in checks)
    # issue 25 item 9: the pool must be the node's own too (tests/e2e/test_charts_install.py proves it)
    assert "object.spec.?pool.?name" in variables["newPool"]
    assert any("variables.newPool == variables.driverNode" in c for c in checks)
    assert any("variables.oldPool == variables.driverNode" in c for c in checks)
    binding = seed_dra.get("ValidatingAdmissionPolicyBinding", "neuron-dra-driver-resourceslices")
    assert binding["spec"] == {"policyName": "neuron-dra-driver-resourceslices", "validationActions": ["Deny"]}


def test_dra_driver_in_another_release_namespace_gets_its_own_namespace(helm: Path) -> None:
    r = template(helm, NEURON_CHART, "--namespace", "default", "--set", "devicePlugin.enabled=false",
                 "--set", "npd.enabled=false", "--set", "draDriver.enabled=true")  # fmt: skip
    (ns,) = r.all("Namespace")
    assert ns["metadata"]["name"] == "neuron-dra-driver"
    assert ns["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "privileged"
    assert r.get("DaemonSet", DRA_DS)["metadata"]["namespace"] == "neuron-dra-driver"
    cond = r.get("ValidatingAdmissionPolicy", "neuron-dra-driver-resourceslices")["spec"]["matchConditions"][0]
    assert "system:serviceaccount:neuron-dra-driver:neuron-dra-driver-sa" in cond["expression"]


def test_namespaces_are_created_once_and_only_when_asked(helm: Path) -> None:
    shared = ["--set", "devicePlugin.enabled=false", "--set", "draDriver.enabled=true",
              "--set", "draDriver.namespace=neuron-agents", "--set", "npd.namespace=neuron-agents"]  # fmt: skip
    r = template(helm, NEURON_CHART, "--namespace", "default", *shared)
    assert [ns["metadata"]["name"] for ns in r.all("Namespace")] == ["neuron-agents"]
    assert {d["metadata"]["namespace"] for d in r.all("DaemonSet")} == {"neuron-agents"}
    r = template(helm, NEURON_CHART, "--namespace", "default", *shared,
                 "--set", "draDriver.createNamespace=false", "--set", "npd.createNamespace=false")  # fmt: skip
    assert r.all("Namespace") == []


# --------------------------------------------------------------------------------------------------------------------
# Neuron chart: the seed's device plugin install, defaults, the refused combination


def test_seed_device_plugin_install(seed_device_plugin: Rendered) -> None:
    assert seed_device_plugin.names("DaemonSet") == {DP_DS}
    ds = seed_device_plugin.get("DaemonSet", DP_DS)
    assert ds["metadata"]["namespace"] == "kube-system"  # the release itself went to "default"
    assert ds["spec"]["template"]["metadata"]["labels"]["name"] == "neuron-device-plugin-ds"
    pod = ds["spec"]["template"]["spec"]
    assert pod["priorityClassName"] == "system-node-critical"
    assert pod.get("automountServiceAccountToken", True) is True  # it labels its own Node
    tolerated = {t.get("key") for t in pod["tolerations"]}
    assert {"CriticalAddonsOnly", "aws.amazon.com/neuron"} <= tolerated
    c = container(ds)
    assert c["command"] == ["neuron-device-plugin", "serve"]
    assert env_of(c)["METRICS_PORT"] == "9811"
    mounts = mounts_of(ds)
    assert mounts["/var/lib/kubelet/device-plugins"] == {
        "host": "/var/lib/kubelet/device-plugins", "type": "Directory", "readOnly": False,
    }  # fmt: skip
    assert mounts["/var/lib/kubelet/pod-resources"]["host"] == "/var/lib/kubelet/pod-resources"
    assert mounts["/var/lib/kubelet/plugins_registry"]["readOnly"] is True
    assert mounts["/opt/aws"]["readOnly"] is True
    # Health needs /dev/neuronN: a device whose node is missing is reported unhealthy.
    assert mounts["/dev"] == {"host": "/dev", "type": "Directory", "readOnly": True}
    assert not c["terminationMessagePath"].startswith("/dev/")
    sc = c["securityContext"]
    assert (sc["privileged"], sc["allowPrivilegeEscalation"], sc["capabilities"]) == (False, False, {"drop": ["ALL"]})
    assert seed_device_plugin.all("DeviceClass") == []
    assert seed_device_plugin.names("ValidatingAdmissionPolicy") == {"neuron-own-node-keys.default.neuron-helm-chart"}
    role = seed_device_plugin.get("ClusterRole", "neuron-device-plugin")
    # only its Node's labels, and Events (on its Node, when it stands down for the DRA driver)
    assert granted_rules(role) == {(("",), ("nodes",), ()): {"get", "patch"}, (("",), ("events",), ()): {"create"}}
    assert seed_device_plugin.all("Namespace") == []
    assert_namespaced(seed_device_plugin)


def test_dra_driver_with_device_plugin_fails_with_the_reason(helm: Path) -> None:
    with pytest.raises(RenderError) as err:
        template(helm, NEURON_CHART, "--set", "draDriver.enabled=true")
    message = str(err.value)
    assert "draDriver.enabled=true cannot be combined with devicePlugin.enabled=true" in message
    assert "same node" in message and "oversubscription" in message
    assert "--set devicePlugin.enabled=false" in message


def test_defaults_are_device_plugin_and_npd(neuron_defaults: Rendered) -> None:
    assert neuron_defaults.names("DaemonSet") == {DP_DS, NPD_DS}
    assert neuron_defaults.names("Namespace") == {"neuron-healthcheck-system"}
    assert neuron_defaults.names("Service") == {"neuron-device-plugin-metrics", "node-problem-detector-metrics"}
    assert neuron_defaults.all("ServiceMonitor") == []
    assert_namespaced(neuron_defaults)


COMPONENT_TOGGLES = [combo for combo in itertools.product([True, False], repeat=3) if not (combo[0] and combo[1])]


@pytest.mark.parametrize(("device_plugin", "dra_driver", "npd"), COMPONENT_TOGGLES)
def test_every_toggle_renders_and_lints(helm: Path, device_plugin: bool, dra_driver: bool, npd: bool) -> None:
    flags = [
        "--set", f"devicePlugin.enabled={str(device_plugin).lower()}",
        "--set", f"draDriver.enabled={str(dra_driver).lower()}",
        "--set", f"npd.enabled={str(npd).lower()}",
        "--set", "serviceMonitor.enabled=true",
    ]  # fmt: skip
    r = template(helm, NEURON_CHART, "--namespace", "neuron-dra-driver", *flags)
    expected = {name for name, on in [(DP_DS, device_plugin), (DRA_DS, dra_driver), (NPD_DS, npd)] if on}
    assert r.names("DaemonSet") == expected
    assert len(r.all("ServiceMonitor")) == len(expected)
    assert ("neuron.aws.com" in r.names("DeviceClass")) is dra_driver
    assert ("neuron-node-problem-detector-config" in r.names("ConfigMap")) is npd
    assert_namespaced(r)
    run_helm(helm, ["lint", "--strict", str(NEURON_CHART), "--namespace", "neuron-dra-driver", *flags])


def test_neuron_chart_lints_with_defaults(helm: Path) -> None:
    out = run_helm(helm, ["lint", "--strict", str(NEURON_CHART)])
    assert "0 chart(s) failed" in out


# --------------------------------------------------------------------------------------------------------------------
# Neuron chart: node problem detection


def npd_monitor(r: Rendered) -> dict[str, Any]:
    cm = r.get("ConfigMap", "neuron-node-problem-detector-config")
    return dict(json.loads(cm["data"]["neuron-kernel-monitor.json"]))


def npd_reason_for(monitor: dict[str, Any], line: str) -> str | None:
    """The rule node-problem-detector would fire for this kernel line: it matches ``pattern + \\z`` at the end of the
    log (Go RE2; Python's re agrees on these patterns)."""
    for rule in monitor["rules"]:
        if re.search(rule["pattern"] + r"\Z", line):
            return str(rule["reason"])
    return None


def test_npd_rule_set_sets_neuron_health(neuron_defaults: Rendered) -> None:
    monitor = npd_monitor(neuron_defaults)
    assert (monitor["plugin"], monitor["logPath"], monitor["lookback"]) == ("kmsg", "/dev/kmsg", "5m")
    assert monitor["conditions"] == [
        {"type": "NeuronHealth", "reason": "NeuronHasNoError", "message": "no Neuron hardware error in the kernel log"}
    ]
    assert {r["reason"] for r in monitor["rules"]} == {
        "NeuronHasError_SRAM_UNCORRECTABLE_ERROR",
        "NeuronHasError_NC_UNCORRECTABLE_ERROR",
        "NeuronHasError_HBM_UNCORRECTABLE_ERROR",
        "NeuronHasError_DMA_ERROR",
        "NeuronHasError_HANG_ON_COLLECTIVES",
    }
    assert {(r["type"], r["condition"]) for r in monitor["rules"]} == {("permanent", "NeuronHealth")}


@pytest.mark.parametrize(
    ("line", "reason"),
    [
        # The runtime's kernel line (Neuron SDK troubleshooting guide), with and without a driver prefix.
        (
            "NEURON_HW_ERR=SRAM_UNCORRECTABLE_ERROR instance-id=i-0abc hostname=ip-10-0-0-1 nd-id=0 nc-id=0 "
            "serial-num=123 action=TERMINATE_INSTANCE",
            "NeuronHasError_SRAM_UNCORRECTABLE_ERROR",
        ),
        ("neuron: NEURON_HW_ERR=HBM_UNCORRECTABLE_ERROR nd-id=3", "NeuronHasError_HBM_UNCORRECTABLE_ERROR"),
        ("NEURON_HW_ERR=DMA_ERROR", "NeuronHasError_DMA_ERROR"),
        ("NEURON_HW_ERR=NC_UNCORRECTABLE_ERROR nd-id=1 nc-id=2", "NeuronHasError_NC_UNCORRECTABLE_ERROR"),
        ("NEURON_HW_ERR=HANG_ON_COLLECTIVES nd-id=1", "NeuronHasError_HANG_ON_COLLECTIVES"),
        # Not Neuron hardware errors, or not these ones.
        ("NEURON_HW_ERR=DMA_ERROR_RECOVERED nd-id=0", None),
        ("XNEURON_HW_ERR=DMA_ERROR", None),
        ("NEURON_HW_ERR=SOMETHING_ELSE nd-id=0", None),
        ("EXT4-fs error (device nvme0n1p1): DMA_ERROR", None),
    ],
)
def test_npd_patterns_match_kernel_lines(neuron_defaults: Rendered, line: str, reason: str | None) -> None:
    assert npd_reason_for(npd_monitor(neuron_defaults), line) == reason


def test_npd_error_list_is_configurable(helm: Path) -> None:
    r = template(helm, NEURON_CHART, "--set", "npd.errors={DMA_ERROR,NEW_ERROR}")
    monitor = npd_monitor(r)
    assert npd_reason_for(monitor, "NEURON_HW_ERR=NEW_ERROR nd-id=0") == "NeuronHasError_NEW_ERROR"
    assert npd_reason_for(monitor, "NEURON_HW_ERR=HBM_UNCORRECTABLE_ERROR nd-id=0") is None


def test_npd_daemonset(neuron_defaults: Rendered) -> None:
    ds = neuron_defaults.get("DaemonSet", NPD_DS)
    assert ds["metadata"]["namespace"] == "neuron-healthcheck-system"
    pod = ds["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == "node-problem-detector"
    c = container(ds)
    assert c["image"].startswith("registry.k8s.io/node-problem-detector/node-problem-detector:")
    assert "--config.system-log-monitor=/config/neuron-kernel-monitor.json" in c["args"]
    assert "--prometheus-port=20257" in c["args"]
    assert env_of(c)["NODE_NAME"] == {"fieldRef": {"fieldPath": "spec.nodeName"}}
    assert c["securityContext"] == {"privileged": True}  # /dev/kmsg
    assert c["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "healthz"}
    mounts = mounts_of(ds)
    assert mounts["/dev/kmsg"] == {"host": "/dev/kmsg", "type": "CharDevice", "readOnly": True}
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["config"]["configMap"]["name"] == "neuron-node-problem-detector-config"
    # The config checksum rolls the pods when the rules change.
    assert re.fullmatch(r"[0-9a-f]{64}", ds["spec"]["template"]["metadata"]["annotations"]["checksum/config"])
    role = neuron_defaults.get("ClusterRole", "neuron-node-problem-detector")
    granted = {(r["resources"][0], v) for r in role["rules"] for v in r["verbs"]}
    assert ("nodes/status", "patch") in granted and ("events", "create") in granted
    assert ("nodes", "patch") not in granted


# --------------------------------------------------------------------------------------------------------------------
# Neuron chart: paths, metrics, node selection, schema


def test_kubelet_root_dir_moves_every_kubelet_path_but_device_plugins(helm: Path) -> None:
    # The kubelet serves kubelet.sock at /var/lib/kubelet/device-plugins whatever its --root-dir (k8s.io/kubelet
    # deviceplugin/v1beta1 DevicePluginPath); its plugins_registry, plugins and pod-resources follow --root-dir.
    fixed = "/var/lib/kubelet/device-plugins"
    for flags in (["--set", "npd.enabled=false"], ["--set", "devicePlugin.enabled=false", "--set", "npd.enabled=false",
                                                   "--set", "draDriver.enabled=true"]):  # fmt: skip
        r = template(helm, NEURON_CHART, "--set", "kubeletRootDir=/data/kubelet", *flags)
        (ds,) = r.all("DaemonSet")
        mounts = mounts_of(ds)
        kubelet_mounts = {path: m for path, m in mounts.items() if "kubelet" in path and path != fixed}
        assert kubelet_mounts, "no kubelet directory mounted"
        for path, m in kubelet_mounts.items():
            assert path.startswith("/data/kubelet/") and m["host"] == path, (path, m)
        assert mounts[fixed]["host"] == fixed
        env = env_of(container(ds))
        assert env["KUBELET_ROOT"] == "/data/kubelet"
        assert env["DEVICE_PLUGINS_DIR"] == fixed
        assert all("/var/lib/kubelet" not in str(v) for k, v in env.items() if k != "DEVICE_PLUGINS_DIR")
        moved = template(helm, NEURON_CHART, "--set", "devicePluginsDir=/opt/dp", *flags)
        (ds,) = moved.all("DaemonSet")
        assert mounts_of(ds)["/opt/dp"]["host"] == "/opt/dp"
        assert env_of(container(ds))["DEVICE_PLUGINS_DIR"] == "/opt/dp"


def test_cdi_root_dir_is_configurable(helm: Path) -> None:
    r = template(helm, NEURON_CHART, "--set", "devicePlugin.enabled=false", "--set", "draDriver.enabled=true",
                 "--set", "draDriver.cdiRootDir=/etc/cdi")  # fmt: skip
    ds = r.get("DaemonSet", DRA_DS)
    assert env_of(container(ds))["CDI_ROOT"] == "/etc/cdi"
    assert mounts_of(ds)["/etc/cdi"]["host"] == "/etc/cdi"


def test_metrics_service_per_daemon_matches_its_pods(helm: Path) -> None:
    for flags, ds_name, svc_name, port in [
        ([], DP_DS, "neuron-device-plugin-metrics", 9811),
        ([], NPD_DS, "node-problem-detector-metrics", 20257),
        (["--set", "devicePlugin.enabled=false", "--set", "draDriver.enabled=true"], DRA_DS,
         "neuron-dra-driver-metrics", 9812),
    ]:  # fmt: skip
        r = template(helm, NEURON_CHART, *flags)
        ds, svc = r.get("DaemonSet", ds_name), r.get("Service", svc_name)
        assert svc["metadata"]["namespace"] == ds["metadata"]["namespace"]
        assert svc["spec"]["clusterIP"] == "None"
        pod_labels = ds["spec"]["template"]["metadata"]["labels"]
        assert svc["spec"]["selector"].items() <= pod_labels.items()
        assert svc["spec"]["ports"] == [{"name": "metrics", "port": port, "targetPort": "metrics", "protocol": "TCP"}]
        assert {"name": "metrics", "containerPort": port, "protocol": "TCP"} in container(ds)["ports"]


def test_service_monitor_selects_the_metrics_service(helm: Path) -> None:
    flags = ["--set", "serviceMonitor.enabled=true", "--set", "serviceMonitor.labels.release=kps"]
    r = template(helm, NEURON_CHART, *flags)
    for name, svc_name in [("neuron-device-plugin", "neuron-device-plugin-metrics"),
                           ("node-problem-detector", "node-problem-detector-metrics")]:  # fmt: skip
        sm, svc = r.get("ServiceMonitor", name), r.get("Service", svc_name)
        assert sm["apiVersion"] == "monitoring.coreos.com/v1"
        assert sm["metadata"]["namespace"] == svc["metadata"]["namespace"]
        assert sm["metadata"]["labels"]["release"] == "kps"
        assert sm["spec"]["selector"]["matchLabels"].items() <= svc["metadata"]["labels"].items()
        assert sm["spec"]["endpoints"][0]["port"] == "metrics"


def test_metrics_can_be_switched_off(helm: Path) -> None:
    r = template(helm, NEURON_CHART, "--set", "devicePlugin.metrics.enabled=false", "--set", "npd.enabled=false")
    assert r.all("Service") == []
    c = container(r.get("DaemonSet", DP_DS))
    assert env_of(c)["METRICS_PORT"] == "0"
    assert "ports" not in c


def test_node_selection_by_instance_type_or_label(neuron_defaults: Rendered) -> None:
    ds = neuron_defaults.get("DaemonSet", DP_DS)
    linux = {"kubernetes.io/os": "linux"}
    assert node_matches(ds, {**linux, "node.kubernetes.io/instance-type": "trn2.48xlarge"})
    # A type the list does not know yet, labelled by its node group: selected.
    assert node_matches(ds, {**linux, "node.kubernetes.io/instance-type": "trn9.48xlarge",
                             "aws.amazon.com/neuron.present": "true"})  # fmt: skip
    assert not node_matches(ds, {**linux, "node.kubernetes.io/instance-type": "trn9.48xlarge"})
    assert not node_matches(ds, {**linux, "node.kubernetes.io/instance-type": "m5.large"})
    assert not node_matches(ds, {**linux, "node.kubernetes.io/instance-type": "trn2.48xlarge",
                                 "eks.amazonaws.com/compute-type": "auto"})  # fmt: skip


def test_node_selection_covers_every_neuron_type_of_the_catalog(neuron_defaults: Rendered) -> None:
    listed = next(e["values"] for e in node_terms(neuron_defaults.get("DaemonSet", DP_DS))[0]
                  if e["key"] == "node.kubernetes.io/instance-type")  # fmt: skip
    neuron_types = {name for name, t in catalog.load().items() if t.neuron}
    assert neuron_types and neuron_types <= set(listed)


def test_node_selection_options(helm: Path) -> None:
    everywhere = template(helm, NEURON_CHART, "--set", "nodeSelection.allNodes=true")
    ds = everywhere.get("DaemonSet", DP_DS)
    assert len(node_terms(ds)) == 1
    assert node_matches(ds, {"kubernetes.io/os": "linux", "node.kubernetes.io/instance-type": "m5.large"})
    assert not node_matches(ds, {"kubernetes.io/os": "windows"})

    by_key = template(helm, NEURON_CHART, "--set-json", "nodeSelection.instanceTypes=[]",
                      "--set", "nodeSelection.nodeLabels[0].key=example.com/neuron")  # fmt: skip
    ds = by_key.get("DaemonSet", DP_DS)
    assert node_matches(ds, {"kubernetes.io/os": "linux", "example.com/neuron": "anything"})
    assert not node_matches(ds, {"kubernetes.io/os": "linux", "node.kubernetes.io/instance-type": "trn2.48xlarge"})

    custom = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
        {"matchExpressions": [{"key": "pool", "operator": "In", "values": ["neuron"]}]}]}}}  # fmt: skip
    overridden = template(helm, NEURON_CHART, "--set-json", f"devicePlugin.affinity={json.dumps(custom)}",
                          "--set", "devicePlugin.nodeSelector.team=ml")  # fmt: skip
    spec = overridden.get("DaemonSet", DP_DS)["spec"]["template"]["spec"]
    assert spec["affinity"] == custom
    assert spec["nodeSelector"] == {"team": "ml"}

    with pytest.raises(RenderError, match="nodeSelection selects no node"):
        template(
            helm,
            NEURON_CHART,
            "--set-json",
            "nodeSelection.instanceTypes=[]",
            "--set-json",
            "nodeSelection.nodeLabels=[]",
        )


@pytest.mark.parametrize(
    ("flag", "complaint"),
    [
        ("devicePlugin.enable=false", "additional properties 'enable' not allowed"),
        ("kubeletRootDir=var/lib/kubelet", "/kubeletRootDir"),
        ("kubeletRootDir=/var/lib/kubelet/", "/kubeletRootDir"),
        ("logFormat=text", "/logFormat"),
        ("npd.errors[0]=dma error", "/npd/errors/0"),
        ("draDriver.healthcheckPort=0", "/draDriver/healthcheckPort"),
    ],
)
def test_schema_rejects_bad_values(helm: Path, flag: str, complaint: str) -> None:
    with pytest.raises(RenderError) as err:
        template(helm, NEURON_CHART, "--set", flag)
    assert complaint in str(err.value)


def test_image_tag_defaults_to_app_version_and_digest_wins(helm: Path, neuron_defaults: Rendered) -> None:
    assert container(neuron_defaults.get("DaemonSet", DP_DS))["image"].endswith(":0.1.0")
    digest = "sha256:" + "a" * 64
    r = template(helm, NEURON_CHART, "--set", f"image.digest={digest}", "--set", "image.repository=example.com/agents")
    assert container(r.get("DaemonSet", DP_DS))["image"] == f"example.com/agents@{digest}"


# --------------------------------------------------------------------------------------------------------------------
# EFA chart


def test_efa_daemonset_as_the_documents_expect(efa_defaults: Rendered) -> None:
    assert efa_defaults.names("DaemonSet") == {EFA_DS}
    ds = efa_defaults.get("DaemonSet", EFA_DS)
    assert ds["metadata"]["namespace"] == "kube-system"
    assert ds["spec"]["selector"]["matchLabels"] == {"name": "aws-efa-k8s-device-plugin"}
    assert ds["spec"]["template"]["metadata"]["labels"]["name"] == "aws-efa-k8s-device-plugin"
    pod = ds["spec"]["template"]["spec"]
    assert pod["priorityClassName"] == "system-node-critical"
    assert pod["automountServiceAccountToken"] is True  # for the Events on its Node (nodeEvents), nothing else
    c = container(ds)
    assert c["name"] == "aws-efa-k8s-device-plugin"
    assert c["command"] == ["efa-device-plugin", "serve"]
    env = env_of(c)
    assert (env["KUBELET_ROOT"], env["METRICS_PORT"]) == ("/var/lib/kubelet", "9810")
    mounts = mounts_of(ds)
    assert mounts["/var/lib/kubelet/device-plugins"] == {
        "host": "/var/lib/kubelet/device-plugins", "type": "Directory", "readOnly": False,
    }  # fmt: skip
    assert mounts["/dev/infiniband"] == {"host": "/dev/infiniband", "type": "DirectoryOrCreate", "readOnly": True}
    # the coexistence rule needs the EFA DRA driver's registration socket and presence file, and PodResources (the
    # plugin used to have neither, so it advertised beside a registered driver)
    for path in ("/var/lib/kubelet/plugins_registry", "/var/lib/kubelet/plugins/efa.aws.com",
                 "/var/lib/kubelet/pod-resources"):
        assert mounts[path] == {"host": path, "type": "DirectoryOrCreate", "readOnly": True}, path
    assert c["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "metrics"}
    assert_namespaced(efa_defaults)


def test_efa_runs_as_root_without_privileges(efa_defaults: Rendered) -> None:
    sc = container(efa_defaults.get("DaemonSet", EFA_DS))["securityContext"]
    assert sc["runAsUser"] == 0 and sc["runAsNonRoot"] is False  # the kubelet's socket directory is root's
    assert sc["privileged"] is False
    assert sc["allowPrivilegeEscalation"] is False
    assert sc["capabilities"] == {"drop": ["ALL"]}
    assert sc["readOnlyRootFilesystem"] is True


def test_efa_names_do_not_depend_on_the_release(helm: Path) -> None:
    r = template(helm, EFA_CHART, "--namespace", "tools", release="efa")
    ds = r.get("DaemonSet", EFA_DS)
    assert ds["metadata"]["namespace"] == "kube-system"
    assert r.get("Service", "aws-efa-k8s-device-plugin-metrics")["metadata"]["namespace"] == "kube-system"


def test_efa_node_selection(efa_defaults: Rendered) -> None:
    ds = efa_defaults.get("DaemonSet", EFA_DS)
    linux = {"kubernetes.io/os": "linux"}
    efa_types = {name for name, t in catalog.load().items() if t.efa}
    assert efa_types
    for name in efa_types:
        assert node_matches(ds, {**linux, "node.kubernetes.io/instance-type": name}), name
    assert not node_matches(ds, {**linux, "node.kubernetes.io/instance-type": "c5.large"})
    # A new type missing from the list is still selected when its node group labels it.
    assert node_matches(ds, {**linux, "node.kubernetes.io/instance-type": "p9.48xlarge",
                             "vpc.amazonaws.com/efa.present": "true"})  # fmt: skip
    assert not node_matches(ds, {**linux, "node.kubernetes.io/instance-type": "p5.48xlarge",
                                 "eks.amazonaws.com/compute-type": "auto"})  # fmt: skip
    tolerated = {t.get("key") for t in ds["spec"]["template"]["spec"]["tolerations"]}
    assert {"CriticalAddonsOnly", "aws.amazon.com/efa", "nvidia.com/gpu"} <= tolerated


def test_efa_kubelet_root_metrics_and_service_monitor(helm: Path) -> None:
    r = template(helm, EFA_CHART, "--set", "kubeletRootDir=/data/kubelet", "--set", "serviceMonitor.enabled=true")
    ds = r.get("DaemonSet", EFA_DS)
    # The kubelet serves kubelet.sock at /var/lib/kubelet/device-plugins whatever its --root-dir (k8s.io/kubelet
    # deviceplugin/v1beta1 DevicePluginPath), so a relocated kubelet root leaves that mount where it is.
    assert mounts_of(ds)["/var/lib/kubelet/device-plugins"]["host"] == "/var/lib/kubelet/device-plugins"
    assert "/data/kubelet/device-plugins" not in mounts_of(ds)
    assert env_of(container(ds))["KUBELET_ROOT"] == "/data/kubelet"
    assert env_of(container(ds))["DEVICE_PLUGINS_DIR"] == "/var/lib/kubelet/device-plugins"
    moved = template(helm, EFA_CHART, "--set", "devicePluginsDir=/opt/dp")
    assert mounts_of(moved.get("DaemonSet", EFA_DS))["/opt/dp"]["host"] == "/opt/dp"
    assert env_of(container(moved.get("DaemonSet", EFA_DS)))["DEVICE_PLUGINS_DIR"] == "/opt/dp"
    svc = r.get("Service", "aws-efa-k8s-device-plugin-metrics")
    assert svc["spec"]["selector"] == {"name": "aws-efa-k8s-device-plugin"}
    assert svc["spec"]["ports"][0]["port"] == 9810
    sm = r.get("ServiceMonitor", "aws-efa-k8s-device-plugin")
    assert sm["spec"]["selector"]["matchLabels"].items() <= svc["metadata"]["labels"].items()

    off = template(helm, EFA_CHART, "--set", "metrics.enabled=false", "--set", "serviceMonitor.enabled=true")
    assert off.all("Service") == [] and off.all("ServiceMonitor") == []
    assert env_of(container(off.get("DaemonSet", EFA_DS)))["METRICS_PORT"] == "0"


@pytest.mark.parametrize(
    "flags",
    [
        [],
        ["--set", "nodeSelection.allNodes=true"],
        ["--set", "hostNetwork=false", "--set", "metrics.enabled=false"],
        ["--set", "serviceMonitor.enabled=true", "--set", "logFormat=json"],
    ],
)
def test_efa_chart_lints(helm: Path, flags: list[str]) -> None:
    out = run_helm(helm, ["lint", "--strict", str(EFA_CHART), *flags])
    assert "0 chart(s) failed" in out


def test_efa_schema_rejects_unknown_keys(helm: Path) -> None:
    with pytest.raises(RenderError, match="supportedInstanceLabels"):
        template(helm, EFA_CHART, "--set", "supportedInstanceLabels.keys[0]=x")


# --------------------------------------------------------------------------------------------------------------------
# EFA chart: the DRA driver


def granted_rules(role: dict[str, Any]) -> dict[tuple[tuple[str, ...], tuple[str, ...], tuple[str, ...]], set[str]]:
    return {(tuple(r["apiGroups"]), tuple(r["resources"]), tuple(r.get("resourceNames", ()))): set(r["verbs"])
            for r in role["rules"]}


def test_efa_dra_driver_objects(helm: Path) -> None:
    r = template(helm, EFA_CHART, *EFA_DRA_ON, release="aws-efa-k8s-device-plugin")
    assert r.names("DaemonSet") == {EFA_DRA_DS}, "the device plugin is off"
    dc = r.get("DeviceClass", "efa.networking.k8s.aws")  # the class name of the AWS documents
    assert dc["spec"]["selectors"] == [{"cel": {"expression": 'device.driver == "efa.aws.com"'}}]
    role = r.get("ClusterRole", EFA_DRA_DS)
    assert granted_rules(role) == DRA_DRIVER_RULES
    binding = r.get("ClusterRoleBinding", EFA_DRA_DS)
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": EFA_DRA_DS, "namespace": "kube-system"}]
    sa = r.get("ServiceAccount", EFA_DRA_DS)
    assert sa.get("automountServiceAccountToken", True) is True, "the driver reads claims and writes slices"
    vap = r.get("ValidatingAdmissionPolicy", f"{EFA_DRA_DS}-resourceslices")["spec"]
    assert vap["matchConditions"][0]["expression"] == (
        f'request.userInfo.username == "system:serviceaccount:kube-system:{EFA_DRA_DS}"')
    assert "variables.sliceDriver == 'efa.aws.com'" in [v["expression"] for v in vap["validations"]]
    ds = r.get("DaemonSet", EFA_DRA_DS)
    assert ds["spec"]["updateStrategy"]["rollingUpdate"] == {"maxSurge": 1, "maxUnavailable": 0}
    c = container(ds)
    assert c["command"] == ["efa-dra-driver", "serve"]
    env = env_of(c)
    assert env["CDI_ROOT"] == "/var/run/cdi" and env["HEALTHCHECK_PORT"] == "51516" and env["METRICS_PORT"] == "9813"
    assert env["KUBELET_PLUGINS_DIRECTORY_PATH"] == "/var/lib/kubelet/plugins"
    assert env["KUBELET_REGISTRAR_DIRECTORY_PATH"] == "/var/lib/kubelet/plugins_registry"
    assert {e["name"] for e in c["env"] if "valueFrom" in e} == {"NODE_NAME", "POD_UID", "METRICS_ADDRESS",
                                                                  "POD_NAMESPACE"}
    assert c["livenessProbe"]["grpc"] == {"port": 51516, "service": "liveness"}
    mounts = mounts_of(ds)
    assert mounts["/var/lib/kubelet/device-plugins"]["readOnly"] is True
    assert mounts["/dev/infiniband"]["readOnly"] is True
    assert mounts["/var/run/cdi"]["readOnly"] is False
    assert ds["spec"]["template"]["spec"]["hostNetwork"] is False
    assert r.get("Service", f"{EFA_DRA_DS}-metrics")["spec"]["selector"] == {"name": EFA_DRA_DS}
    assert_namespaced(r)


def test_efa_device_plugin_and_dra_driver_exclude_each_other(helm: Path) -> None:
    with pytest.raises(RenderError, match="draDriver.enabled=true cannot be combined with devicePlugin.enabled=true"):
        template(helm, EFA_CHART, "--set", "draDriver.enabled=true")
    with pytest.raises(RenderError, match="would install nothing"):
        template(helm, EFA_CHART, "--set", "devicePlugin.enabled=false")
    defaults = template(helm, EFA_CHART)
    assert defaults.all("DeviceClass") == [] and defaults.all("ClusterRole") == []


def test_efa_chart_lints_with_the_dra_driver(helm: Path) -> None:
    out = run_helm(helm, ["lint", "--strict", str(EFA_CHART), *EFA_DRA_ON, "--set", "draDriver.hostNetwork=true"])
    assert "0 chart(s) failed" in out


def test_own_node_policy_lists_the_keys_the_daemons_write(helm: Path) -> None:
    for flags, users in [((), ["neuron-device-plugin"]),
                         (("--set", "devicePlugin.enabled=false", "--set", "draDriver.enabled=true"),
                          ["neuron-dra-driver-sa"])]:
        r = template(helm, NEURON_CHART, *flags)
        spec = r.get("ValidatingAdmissionPolicy", "neuron-own-node-keys.default.test")["spec"]
        assert spec["matchConstraints"]["resourceRules"][0]["resources"] == ["nodes"]
        variables = {v["name"]: v["expression"] for v in spec["variables"]}
        assert json.loads(variables["ownedLabels"]) == list(NODE_LABELS)
        cond = spec["matchConditions"][0]["expression"]
        assert all(f":{u}" in cond for u in users) and len(json.loads(cond.split(" in ", 1)[1])) == 1


# --------------------------------------------------------------------------------------------------------------------
# Both charts: the Kubernetes 1.37 DRA settings (device status, taint effect, extended resource)

DRA_1_37 = [(NEURON_CHART, ["--set", "devicePlugin.enabled=false", "--set", "draDriver.enabled=true"], DRA_DS,
             "neuron.aws.com", "neuron.aws.com", "aws.amazon.com/neuron"),
            (EFA_CHART, EFA_DRA_ON, EFA_DRA_DS, "efa.networking.k8s.aws", "efa.aws.com", "vpc.amazonaws.com/efa")]


@pytest.mark.parametrize(("chart", "flags", "ds", "klass", "driver", "resource"), DRA_1_37, ids=["neuron", "efa"])
def test_dra_1_37_settings_default_and_set(helm: Path, chart: Path, flags: list[str], ds: str, klass: str,
                                           driver: str, resource: str) -> None:
    r = template(helm, chart, *flags, release="aws-efa-k8s-device-plugin" if chart == EFA_CHART else "test")
    env = env_of(container(r.get("DaemonSet", ds)))
    assert (env["DEVICE_STATUS"], env["UNHEALTHY_TAINT_EFFECT"]) == ("on", "NoSchedule")
    assert "extendedResourceName" not in r.get("DeviceClass", klass)["spec"], "off by default"
    role = next(d for d in r.docs if d["kind"] == "ClusterRole" and "dra" in d["metadata"]["name"])
    assert device_status_rules(driver).items() <= granted_rules(role).items()

    r = template(helm, chart, *flags, "--set", "draDriver.deviceStatus=false", "--set",
                 "draDriver.unhealthyTaintEffect=NoExecute", "--set", "draDriver.extendedResource=true",
                 release="aws-efa-k8s-device-plugin" if chart == EFA_CHART else "test")
    env = env_of(container(r.get("DaemonSet", ds)))
    assert (env["DEVICE_STATUS"], env["UNHEALTHY_TAINT_EFFECT"]) == ("off", "NoExecute")
    assert r.get("DeviceClass", klass)["spec"]["extendedResourceName"] == resource
    role = next(d for d in r.docs if d["kind"] == "ClusterRole" and "dra" in d["metadata"]["name"])
    assert not any("resourceclaims/" in res for res in granted_rules(role) for res in res[1])
    with pytest.raises(RenderError, match="unhealthyTaintEffect"):
        template(helm, chart, *flags, "--set", "draDriver.unhealthyTaintEffect=Evict")


@pytest.mark.parametrize(("chart", "flags", "ds", "klass", "driver", "resource"), DRA_1_37, ids=["neuron", "efa"])
def test_noexecute_hold_reaches_the_driver_and_bad_values_are_refused(
        helm: Path, chart: Path, flags: list[str], ds: str, klass: str, driver: str, resource: str) -> None:
    """draDriver.unhealthyNoExecuteAfterSeconds: 30 s by default (well above the 0.75 s health poll and a port flap),
    any number of seconds from 0 (NoExecute at once) to a day; negative or non-numeric values are refused."""
    release = "aws-efa-k8s-device-plugin" if chart == EFA_CHART else "test"
    env = env_of(container(template(helm, chart, *flags, release=release).get("DaemonSet", ds)))
    assert env["UNHEALTHY_NOEXECUTE_AFTER"] == "30"
    r = template(helm, chart, *flags, "--set-json", "draDriver.unhealthyNoExecuteAfterSeconds=2.5", release=release)
    assert env_of(container(r.get("DaemonSet", ds)))["UNHEALTHY_NOEXECUTE_AFTER"] == "2.5"
    for bad in ("-1", "\"soon\"", "86401"):
        with pytest.raises(RenderError, match="unhealthyNoExecuteAfterSeconds"):
            template(helm, chart, *flags, "--set-json", f"draDriver.unhealthyNoExecuteAfterSeconds={bad}",
                     release=release)


# --------------------------------------------------------------------------------------------------------------------
# Several releases in one cluster (issue 31 item 2): the guide's DRA install and device-plugin install side by side,
# and the EFA device plugin and DRA driver as two releases. Helm refuses to install an object another release owns,
# and with --take-ownership it hands it over (the older shared own-node policy then named only the second release's
# account), so two releases must render no object in common.

#: Kinds Kubernetes keeps outside namespaces, and the namespaced kinds the charts render; a kind in neither fails.
CLUSTER_SCOPED = {"Namespace", "ClusterRole", "ClusterRoleBinding", "DeviceClass", "ValidatingAdmissionPolicy",
                  "ValidatingAdmissionPolicyBinding", "PriorityClass"}
NAMESPACED_KINDS = NAMESPACED | {"Deployment", "Role", "RoleBinding", "Secret", "NetworkPolicy", "Job"}
#: RFC 1123 subdomain, as Kubernetes validates policy names: at most 253 characters.
DNS_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
#: Each Neuron component alone, as its own release: (release, namespace, flags).
NEURON_COMPONENTS = {
    "draDriver": ("neuron-helm-chart", "neuron-dra-driver", ["--set", "devicePlugin.enabled=false",
                  "--set", "npd.enabled=false", "--set", "draDriver.enabled=true"]),
    "devicePlugin": ("neuron-helm-chart", "default", ["--set", "npd.enabled=false"]),
    "npd": ("neuron-npd", "monitoring", ["--set", "devicePlugin.enabled=false"]),
    "scheduler": ("neuron-sched", "default", ["--set", "devicePlugin.enabled=false", "--set", "npd.enabled=false",
                  "--set", "scheduler.enabled=true"]),
}
EFA_RELEASES = {"efa": ["--namespace", "kube-system"], "efa-dra": ["--namespace", "kube-system", *EFA_DRA_ON]}


def identities(r: Rendered) -> set[tuple[str, str | None, str]]:
    """(kind, namespace or None, name): what the API server keys an object by."""
    out: set[tuple[str, str | None, str]] = set()
    for d in r:
        assert d["kind"] in CLUSTER_SCOPED | NAMESPACED_KINDS, f"classify kind {d['kind']} as cluster-scoped or not"
        scoped = d["kind"] in CLUSTER_SCOPED
        assert scoped != bool(d["metadata"].get("namespace")), f"{d['kind']} {d['metadata']['name']}"
        out.add((d["kind"], None if scoped else d["metadata"]["namespace"], d["metadata"]["name"]))
    return out


def own_node_policy(r: Rendered) -> tuple[str, list[str]]:
    """The own-node policy's name and the users it restricts (its binding must point at it)."""
    policies = [d for d in r.all("ValidatingAdmissionPolicy") if d["spec"]["matchConstraints"]["resourceRules"][0][
        "resources"] == ["nodes"]]
    assert len(policies) == 1, [d["metadata"]["name"] for d in policies]
    name = policies[0]["metadata"]["name"]
    assert r.get("ValidatingAdmissionPolicyBinding", name)["spec"]["policyName"] == name
    cond = policies[0]["spec"]["matchConditions"][0]["expression"]
    return name, json.loads(cond.split(" in ", 1)[1])


def test_seed_installs_share_no_object(seed_dra: Rendered, seed_device_plugin: Rendered) -> None:
    dra, dp = identities(seed_dra), identities(seed_device_plugin)
    assert not dra & dp, f"both installs render {sorted(dra & dp, key=str)}"
    # Each keeps an own-node policy naming only its own daemon's account.
    assert own_node_policy(seed_dra)[1] == ["system:serviceaccount:neuron-dra-driver:neuron-dra-driver-sa"]
    assert own_node_policy(seed_device_plugin)[1] == ["system:serviceaccount:kube-system:neuron-device-plugin"]
    # The guide's objects keep their names; only the DRA release has the DeviceClass.
    assert ("DeviceClass", None, "neuron.aws.com") in dra
    assert {("ClusterRole", None, "neuron-dra-driver"), ("ClusterRole", None, "neuron-device-plugin")} <= dra | dp


@pytest.mark.parametrize(("first", "second"), list(itertools.combinations(NEURON_COMPONENTS, 2)))
def test_releases_of_different_components_share_no_object(helm: Path, first: str, second: str) -> None:
    """Any two Neuron components as two releases (release names and namespaces as a user would pick them)."""
    rendered = []
    for component in (first, second):
        release, namespace, flags = NEURON_COMPONENTS[component]
        rendered.append(identities(template(helm, NEURON_CHART, "--namespace", namespace, *flags, release=release)))
    shared = rendered[0] & rendered[1]
    assert not shared, f"{first} and {second} releases both render {sorted(shared, key=str)}"


def test_own_node_policy_is_named_per_release(helm: Path) -> None:
    """Same release name in two namespaces, and names whose dashes could run together, give distinct valid names."""
    combos = [("neuron-helm-chart", "default"), ("neuron-helm-chart", "neuron-dra-driver"), ("c", "a-b"),
              ("b-c", "a"), ("x" * 53, "n" * 63), ("neuron.v2", "default")]
    names = set()
    for release, namespace in combos:
        name, users = own_node_policy(template(helm, NEURON_CHART, "--namespace", namespace, release=release))
        assert DNS_SUBDOMAIN.fullmatch(name) and len(name) <= 253, name
        assert namespace in name and release in name, name
        assert users == ["system:serviceaccount:kube-system:neuron-device-plugin"]
        names.add(name)
    assert len(names) == len(combos), names


def test_efa_releases_share_no_object(helm: Path) -> None:
    """issue 31's two EFA releases in kube-system: the device plugin (no cluster-scoped object) and the DRA driver."""
    efa, dra = (identities(template(helm, EFA_CHART, *flags, release=rel)) for rel, flags in EFA_RELEASES.items())
    assert not efa & dra, f"both render {sorted(efa & dra, key=str)}"
    assert not {i for i in efa if i[1] is None}, "the EFA device plugin needs no cluster-scoped object"
    assert ("DeviceClass", None, "efa.networking.k8s.aws") in dra


def test_neuron_and_efa_releases_share_no_object(helm: Path, seed_dra: Rendered, seed_device_plugin: Rendered) -> None:
    """All four releases of issue 31 in one cluster: the guide's two Neuron installs and the two EFA releases."""
    releases = {"neuron DRA": identities(seed_dra), "neuron device plugin": identities(seed_device_plugin),
                **{rel: identities(template(helm, EFA_CHART, *flags, release=rel))
                   for rel, flags in EFA_RELEASES.items()}}
    for (a, ida), (b, idb) in itertools.combinations(releases.items(), 2):
        assert not ida & idb, f"{a} and {b} both render {sorted(ida & idb, key=str)}"


# -- hostile host paths (issue: fakeHost.path=/ mounted the node's root, kubelet PKI included, into a root daemon) ----
#: Each a hostile value and the words its refusal must carry. The directories are the Linux FHS's and the kubelet's
#: (its --root-dir /var/lib/kubelet holds pki/; /var/lib/kubelet/device-plugins is fixed by the kubelet).
HOSTILE_PATHS = [
    (("fakeHost.path", "/"), "whole root"),
    (("fakeHost.path", "/var/lib/kubelet"), "/var/lib/kubelet"),
    (("fakeHost.path", "/var/lib/kubelet/pki"), "inside the node's /var/lib/kubelet"),
    (("fakeHost.path", "/var/lib"), "holds the node's"),
    (("fakeHost.path", "/var"), "holds the node's"),
    (("fakeHost.path", "/etc/fake"), "inside the node's /etc"),
    (("fakeHost.path", "/proc"), "/proc"),
    (("fakeHost.path", "/dev/shm/x"), "inside the node's /dev"),
    (("fakeHost.path", "/var/run/cdi"), "/var/run"),
    (("fakeHost.path", "/srv/h/../../etc"), "'..'"),
    (("fakeHost.path", "/srv/h/./x"), "'..'"),
    (("kubeletRootDir", "/var/lib/../lib/kubelet"), "'..'"),
    (("devicePluginsDir", "/var/lib/kubelet/device-plugins/.."), "'..'"),
    (("draDriver.cdiRootDir", "/var/run//cdi"), "'//'"),
    # YAML reads " #" as a comment: the check must see the path the manifest ends up with, not the raw string
    (("fakeHost.path", "/var/lib/kubelet #"), "only letters"),
    (("kubeletRootDir", "/var/lib/kubelet #x"), "only letters"),
    (("fakeHost.path", "/srv/h: x"), "only letters"),
]


@pytest.mark.parametrize("chart", [NEURON_CHART, EFA_CHART], ids=["neuron", "efa"])
@pytest.mark.parametrize(("setting", "words"), HOSTILE_PATHS, ids=[f"{k}={v}" for (k, v), _ in HOSTILE_PATHS])
def test_charts_refuse_hostile_host_paths(helm: Path, chart: Path, setting: tuple[str, str], words: str) -> None:
    key, value = setting
    with pytest.raises(RenderError) as err:
        template(helm, chart, "--set", f"{key}={value}")
    assert words in str(err.value) and key in str(err.value), err.value


@pytest.mark.parametrize("path", ["/var/lib/accel-fake-host", "/root/.local/state/aws-accel-agents/nodes/t1/host",
                                  "/opt/fake-sysfs/trn2", "/srv/hosts/p5/"])
def test_charts_take_a_fake_host_directory_of_its_own(helm: Path, path: str) -> None:
    for chart in (NEURON_CHART, EFA_CHART):
        assert template(helm, chart, "--set", f"fakeHost.path={path}").all("DaemonSet")
