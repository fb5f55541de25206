"""The chart's policy for the device plugin's Node writes, against the real API server: with a token bound to its
Pod, the Neuron device plugin may patch the device-usage annotation of its own Node, and nothing else."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

import pytest
from accel_rig.controlplane import ControlPlane
from chart_render import NEURON_CHART, find_or_build_helm, run_helm
from lightkube import ApiError, Client, KubeConfig, codecs
from lightkube.resources.core_v1 import Node, Pod, ServiceAccount
from lightkube.types import PatchType

USAGE = "neuron.amazonaws.com/device-usage"
TEMPLATES = ("device-plugin/serviceaccount.yaml", "own-node-policy.yaml")


def _patch(client: Client, node: str, annotations: dict[str, str | None]) -> Any:
    return client.patch(Node, node, {"metadata": {"annotations": annotations}}, patch_type=PatchType.MERGE)


def test_device_plugin_patches_only_its_own_nodes_usage_annotation(
        control_plane: ControlPlane, kube_client: Client, namespace: str, fake_node: Callable[..., str],
        wait: Callable[..., Any]) -> None:
    args = ["template", "neuron", str(NEURON_CHART), "--set", f"devicePlugin.namespace={namespace}"]
    for t in TEMPLATES:
        args += ["-s", f"templates/{t}"]
    objects = list(codecs.load_all_yaml(run_helm(find_or_build_helm(), args)))
    created = []
    try:
        for obj in objects:
            kube_client.create(obj)
            created.append(obj)
        node_a, node_b = fake_node(), fake_node()
        kube_client.create(Pod.from_dict({  # type: ignore[call-overload]
            "metadata": {"name": "plugin", "namespace": namespace},
            "spec": {"nodeName": node_a, "serviceAccountName": "neuron-device-plugin",
                     "containers": [{"name": "c", "image": "busybox"}]}}))
        wait(lambda: kube_client.get(ServiceAccount, "neuron-device-plugin", namespace=namespace), "the SA")
        token = control_plane.mint_token(namespace, "neuron-device-plugin", bound_pod="plugin")
        with Client(KubeConfig.from_file(control_plane.kubeconfig_for_token(token))) as plugin:
            # The policy takes effect once the API server has loaded it; until then RBAC alone lets this through.
            def refused_on_b() -> str | None:
                try:
                    _patch(plugin, node_b, {USAGE: "{}"})
                except ApiError as e:
                    return e.status.message if e.status.code in (403, 422) else None
                _patch(kube_client, node_b, {USAGE: None})
                return None

            message = wait(refused_on_b, "the policy to refuse another node's annotation")
            assert f"may only change its own Node, not '{node_b}'" in message

            updated = _patch(plugin, node_a, {USAGE: '{"v":1}'})
            assert updated.metadata.annotations[USAGE] == '{"v":1}'
            with pytest.raises(ApiError) as err:
                _patch(plugin, node_a, {"example.com/other": "x"})
            message = err.value.status.message or ""
            assert "may only change the annotations" in message and "not example.com/other" in message
            with pytest.raises(ApiError) as err:
                plugin.patch(Node, node_a, {"metadata": {"labels": {"example.com/l": "x"}}},
                             patch_type=PatchType.MERGE)
            assert "may only change the labels" in (err.value.status.message or "")
            with pytest.raises(ApiError) as err:
                plugin.patch(Node, node_a, {"spec": {"unschedulable": True}}, patch_type=PatchType.MERGE)
            assert "spec" in (err.value.status.message or "")
            _patch(plugin, node_a, {USAGE: None})
    finally:
        for obj in reversed(created):
            with contextlib.suppress(ApiError):
                meta = obj.metadata
                kube_client.delete(type(obj), meta.name, namespace=meta.namespace)  # type: ignore[arg-type]
