"""Smoke tests proving the control plane is the real thing: API validation of resource.k8s.io/v1, claims made
from templates by kube-controller-manager and allocated by kube-scheduler, RBAC with TokenRequest tokens,
and helm against the API server."""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from accel_rig.controlplane import ControlPlane
from accel_rig.kubeversions import KubeVersions
from lightkube import ApiError, Client, KubeConfig, codecs
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.authentication_v1 import SelfSubjectReview
from lightkube.resources.core_v1 import ConfigMap, Pod, Secret, ServiceAccount
from lightkube.resources.rbac_authorization_v1 import Role, RoleBinding
from lightkube.resources.resource_v1 import DeviceClass, ResourceClaim, ResourceSlice

DOMAIN = "smoke.accel.test"
CHART = Path(__file__).parent / "testdata" / "smoke-chart"
NODE_NAME_KEY = "authentication.kubernetes.io/node-name"

Wait = Callable[..., Any]
NewName = Callable[[str], str]


def device(index: int, *, model: str = "trn2", taints: list[dict[str, str]] | None = None) -> dict[str, Any]:
    dev: dict[str, Any] = {
        "name": f"accel-{index}",
        "attributes": {
            "index": {"int": index},
            "model": {"string": model},
            "driverVersion": {"version": "2.1.0"},
            "healthy": {"bool": True},
        },
        "capacity": {"memory": {"value": "96Gi"}},
    }
    if taints:
        dev["taints"] = taints
    return dev


def resource_slice(name: str, driver: str, node: str, devices: list[dict[str, Any]]) -> Any:
    return codecs.from_dict(
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceSlice",
            "metadata": {"name": name},
            "spec": {
                "driver": driver,
                "nodeName": node,
                "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
                "devices": devices,
            },
        }
    )


def device_class(driver: str) -> Any:
    return codecs.from_dict(
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "DeviceClass",
            "metadata": {"name": driver},
            "spec": {"selectors": [{"cel": {"expression": f'device.driver == "{driver}"'}}]},
        }
    )


def as_dict(obj: Any) -> Any:
    """A lightkube object as the plain JSON-like dict the API server sent (``Any`` for easy indexing)."""
    return obj.to_dict()


def node_name_claim(control_plane: ControlPlane, token: str) -> tuple[str | None, list[str]]:
    """(username, node-name extra) of the identity ``token`` authenticates as, via SelfSubjectReview."""
    with Client(KubeConfig.from_file(control_plane.kubeconfig_for_token(token))) as client:
        info = as_dict(client.create(SelfSubjectReview()))["status"]["userInfo"]
    return info["username"], list(info.get("extra", {}).get(NODE_NAME_KEY, []))


def test_deviceclass_and_handwritten_resourceslice_are_accepted(
    kube_client: Client, fake_node: Callable[..., str], kube_cleanup: list[Any], new_name: NewName
) -> None:
    node = fake_node()
    driver = f"{new_name('drv')}.{DOMAIN}"
    kube_cleanup.append(kube_client.create(device_class(driver)))
    taint = {"key": f"{DOMAIN}/degraded", "value": "ecc", "effect": "NoSchedule"}
    devices = [device(i) for i in range(3)] + [device(3, taints=[taint])]
    kube_cleanup.append(kube_client.create(resource_slice(new_name("slice"), driver, node, devices)))

    [only] = [as_dict(s)["spec"] for s in kube_client.list(ResourceSlice, fields={"spec.nodeName": node})]
    assert only["driver"] == driver
    assert [d["name"] for d in only["devices"]] == ["accel-0", "accel-1", "accel-2", "accel-3"]
    assert only["devices"][1]["attributes"]["index"] == {"int": 1}
    assert only["devices"][0]["attributes"]["driverVersion"] == {"version": "2.1.0"}
    assert only["devices"][0]["capacity"]["memory"] == {"value": "96Gi"}
    # Kept only with the DRADeviceTaints feature gate on; without it the API server drops the field silently.
    kept = [{k: t[k] for k in ("key", "value", "effect")} for t in only["devices"][3].get("taints", [])]
    assert kept == [taint]
    selector = as_dict(kube_client.get(DeviceClass, driver))["spec"]["selectors"][0]
    assert selector == {"cel": {"expression": f'device.driver == "{driver}"'}}


def test_claim_from_template_is_allocated_by_scheduler_and_pod_bound(
    control_plane: ControlPlane,
    kube_client: Client,
    namespace: str,
    fake_node: Callable[..., str],
    kube_cleanup: list[Any],
    new_name: NewName,
    wait: Wait,
) -> None:
    node = fake_node()
    driver = f"{new_name('drv')}.{DOMAIN}"
    kube_cleanup.append(kube_client.create(device_class(driver)))
    kube_cleanup.append(
        kube_client.create(resource_slice(new_name("slice"), driver, node, [device(i) for i in range(4)]))
    )
    template = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": "two-accels", "namespace": namespace},
        "spec": {
            "spec": {"devices": {"requests": [{"name": "accels", "exactly": {"deviceClassName": driver, "count": 2}}]}}
        },
    }
    kube_client.create(codecs.from_dict(template))
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "worker", "namespace": namespace},
        "spec": {
            "nodeSelector": {"kubernetes.io/hostname": node},
            "resourceClaims": [{"name": "accels", "resourceClaimTemplateName": "two-accels"}],
            "containers": [
                {"name": "main", "image": "registry.k8s.io/pause:3.10", "resources": {"claims": [{"name": "accels"}]}}
            ],
        },
    }
    kube_client.create(codecs.from_dict(pod))

    def claim_name() -> str | None:
        statuses = as_dict(kube_client.get(Pod, "worker", namespace=namespace)).get("status", {})
        return next(
            (s["resourceClaimName"] for s in statuses.get("resourceClaimStatuses", []) if s["name"] == "accels"), None
        )

    name = wait(claim_name, "kube-controller-manager to create the claim from the template")

    def allocated_claim() -> Any:
        claim = as_dict(kube_client.get(ResourceClaim, name, namespace=namespace))
        return claim if claim.get("status", {}).get("allocation") else None

    claim = wait(allocated_claim, f"kube-scheduler to allocate claim {name}")
    results = claim["status"]["allocation"]["devices"]["results"]
    assert len(results) == 2
    assert {(r["request"], r["driver"], r["pool"]) for r in results} == {("accels", driver, node)}
    devices = {r["device"] for r in results}
    assert len(devices) == 2 and devices <= {f"accel-{i}" for i in range(4)}
    assert [(o["kind"], o["name"]) for o in claim["metadata"]["ownerReferences"]] == [("Pod", "worker")]

    def bound_node() -> str | None:
        node_name: str | None = as_dict(kube_client.get(Pod, "worker", namespace=namespace))["spec"].get("nodeName")
        return node_name

    assert wait(bound_node, "kube-scheduler to bind the Pod") == node
    worker_uid = as_dict(kube_client.get(Pod, "worker", namespace=namespace))["metadata"]["uid"]
    reserved = as_dict(kube_client.get(ResourceClaim, name, namespace=namespace))["status"].get("reservedFor", [])
    assert [r["uid"] for r in reserved] == [worker_uid]

    # A token bound to the scheduled Pod names its node (what a DRA driver's admission policy checks).
    token = control_plane.mint_token(namespace, "default", bound_pod="worker")
    assert node_name_claim(control_plane, token) == (f"system:serviceaccount:{namespace}:default", [node])


@pytest.mark.parametrize(
    ("case", "at_limit", "over_limit"),
    [
        ("129 devices", [device(i) for i in range(128)], [device(i) for i in range(129)]),
        ("65-character string attribute", [device(0, model="m" * 64)], [device(0, model="m" * 65)]),
    ],
)
def test_invalid_resourceslice_is_rejected_with_422(
    kube_client: Client,
    fake_node: Callable[..., str],
    kube_cleanup: list[Any],
    new_name: NewName,
    case: str,
    at_limit: list[dict[str, Any]],
    over_limit: list[dict[str, Any]],
) -> None:
    node = fake_node()
    driver = f"{new_name('drv')}.{DOMAIN}"
    kube_cleanup.append(kube_client.create(resource_slice(new_name("ok"), driver, node, at_limit)))
    with pytest.raises(ApiError) as err:
        kube_client.create(resource_slice(new_name("bad"), driver, node, over_limit))
    assert err.value.status.code == 422, f"{case}: {err.value.status.message}"
    assert err.value.status.reason == "Invalid"
    assert "spec.devices" in (err.value.status.message or "")


def helm(control_plane: ControlPlane, tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {
        **os.environ,
        "HELM_CACHE_HOME": str(tmp_path / "helm-cache"),
        "HELM_CONFIG_HOME": str(tmp_path / "helm-config"),
        "HELM_DATA_HOME": str(tmp_path / "helm-data"),
    }
    env.pop("KUBECONFIG", None)
    return subprocess.run(
        [str(control_plane.helm), *args], env=env, capture_output=True, text=True, timeout=120, check=False
    )


def test_helm_lint_template_and_install(
    control_plane: ControlPlane, kube_client: Client, namespace: str, tmp_path: Path, new_name: NewName, wait: Wait
) -> None:
    release = new_name("smoke")
    lint = helm(control_plane, tmp_path, "lint", str(CHART))
    assert lint.returncode == 0, lint.stdout + lint.stderr
    assert "0 chart(s) failed" in lint.stdout

    rendered = helm(
        control_plane, tmp_path, "template", release, str(CHART), "--namespace", namespace,
        "--kube-version", KubeVersions().kube,  # offline rendering assumes an old version otherwise
    )  # fmt: skip
    assert rendered.returncode == 0, rendered.stderr
    kinds = [d["kind"] for d in yaml.safe_load_all(rendered.stdout) if d]
    assert sorted(kinds) == ["ConfigMap", "DeviceClass", "Role", "RoleBinding", "ServiceAccount"]

    kubeconfig = str(control_plane.admin_kubeconfig)
    install = helm(
        control_plane, tmp_path, "install", release, str(CHART), "--namespace", namespace,
        "--kubeconfig", kubeconfig, "--wait", "--timeout", "90s",
    )  # fmt: skip
    assert install.returncode == 0, install.stdout + install.stderr
    settings = kube_client.get(ConfigMap, f"{release}-settings", namespace=namespace)
    # The chart's kubeVersion constraint passed and the server reports the stamped version.
    assert settings.data == {"greeting": "hello from the smoke chart", "kubeVersion": KubeVersions().kube}
    labels = as_dict(kube_client.get(DeviceClass, f"{release}.{DOMAIN}"))["metadata"]["labels"]
    assert labels["app.kubernetes.io/instance"] == release

    listed = helm(control_plane, tmp_path, "list", "--namespace", namespace, "--kubeconfig", kubeconfig, "-o", "json")
    assert [(r["name"], r["status"]) for r in json.loads(listed.stdout)] == [(release, "deployed")]

    uninstall = helm(
        control_plane, tmp_path, "uninstall", release, "--namespace", namespace, "--kubeconfig", kubeconfig
    )
    assert uninstall.returncode == 0, uninstall.stderr

    def device_class_gone() -> bool:
        try:
            kube_client.get(DeviceClass, f"{release}.{DOMAIN}")
        except ApiError as e:
            return e.status.code == 404
        return False

    wait(device_class_gone, "helm uninstall to delete the DeviceClass")


def test_service_account_token_with_narrow_role_is_refused_the_rest(
    control_plane: ControlPlane, kube_client: Client, namespace: str, wait: Wait
) -> None:
    ns = namespace
    kube_client.create(ServiceAccount(metadata=ObjectMeta(name="reader", namespace=ns)))
    kube_client.create(ConfigMap(metadata=ObjectMeta(name="visible", namespace=ns), data={"k": "v"}))
    kube_client.create(Secret(metadata=ObjectMeta(name="hidden", namespace=ns), stringData={"k": "v"}))
    role = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "Role",
        "metadata": {"name": "get-configmaps", "namespace": ns},
        "rules": [{"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get"]}],
    }
    binding = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "RoleBinding",
        "metadata": {"name": "reader-get-configmaps", "namespace": ns},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "get-configmaps"},
        "subjects": [{"kind": "ServiceAccount", "name": "reader", "namespace": ns}],
    }
    kube_client.create(codecs.from_dict(role))
    kube_client.create(codecs.from_dict(binding))
    assert as_dict(kube_client.get(Role, "get-configmaps", namespace=ns))["rules"][0]["verbs"] == ["get"]
    assert (
        as_dict(kube_client.get(RoleBinding, "reader-get-configmaps", namespace=ns))["subjects"][0]["name"] == "reader"
    )

    token = control_plane.mint_token(ns, "reader")
    with Client(KubeConfig.from_file(control_plane.kubeconfig_for_token(token))) as reader:
        visible = wait(lambda: reader.get(ConfigMap, "visible", namespace=ns), "the Role to take effect")
        assert visible.data == {"k": "v"}
        refused: list[tuple[str, Callable[[], object]]] = [
            ("list configmaps", lambda: list(reader.list(ConfigMap, namespace=ns))),
            ("create a configmap", lambda: reader.create(ConfigMap(metadata=ObjectMeta(name="new")), namespace=ns)),
            ("get a secret", lambda: reader.get(Secret, "hidden", namespace=ns)),
            ("get a configmap elsewhere", lambda: reader.get(ConfigMap, "kube-root-ca.crt", namespace="default")),
        ]
        for what, action in refused:
            with pytest.raises(ApiError) as err:
                action()
            assert err.value.status.code == 403, f"{what}: {err.value.status.message}"


def test_node_bound_token_carries_the_node_name(
    control_plane: ControlPlane, kube_client: Client, namespace: str, fake_node: Callable[..., str]
) -> None:
    node = fake_node()
    kube_client.create(ServiceAccount(metadata=ObjectMeta(name="agent", namespace=namespace)))
    bound = control_plane.mint_token(namespace, "agent", bound_node=node)
    unbound = control_plane.mint_token(namespace, "agent")
    user = f"system:serviceaccount:{namespace}:agent"
    assert node_name_claim(control_plane, bound) == (user, [node])
    assert node_name_claim(control_plane, unbound) == (user, [])
