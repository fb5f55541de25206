"""accel_core.ownnode.OwnNode against the real API server: a daemon's labels and annotations on its own Node."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest
from accel_rig.controlplane import ControlPlane
from accel_rig.polling import until
from lightkube import AsyncClient, Client, KubeConfig
from lightkube.resources.core_v1 import Node
from lightkube.types import PatchType

from accel_core.ownnode import OwnNode


def logged_count(caplog: pytest.LogCaptureFixture, text: str) -> Callable[[], int]:
    return lambda: sum(text in r.getMessage() for r in caplog.records)


def _meta(client: Client, node: str) -> tuple[dict[str, str], dict[str, str]]:
    meta: Any = client.get(Node, node).metadata
    return dict(meta.labels or {}), dict(meta.annotations or {})


def test_own_node_labels_and_annotations(control_plane: ControlPlane, kube_client: Client,
                                         fake_node: Callable[..., str]) -> None:
    node = fake_node(labels={"team": "ml"})

    async def scenario() -> None:
        client = AsyncClient(KubeConfig.from_file(control_plane.admin_kubeconfig))
        own = OwnNode(client, node, settle=0.05, recheck=0.5)
        stop = asyncio.Event()
        task = asyncio.create_task(own.run(stop))
        try:
            own.want(labels={"example.com/mode": "4"}, annotations={"example.com/usage": '{"v":1}'})
            await asyncio.wait_for(own.in_sync.wait(), 10)
            labels, annotations = _meta(kube_client, node)
            assert labels["example.com/mode"] == "4" and labels["team"] == "ml"  # other keys stay
            assert annotations["example.com/usage"] == '{"v":1}'

            writes = own.writes
            own.want(labels={"example.com/mode": "4"})  # nothing new: nothing pending, so no write
            assert own.in_sync.is_set() and own.writes == writes

            own.want(labels={"example.com/mode": None})  # None removes the key
            await asyncio.wait_for(own.in_sync.wait(), 10)
            assert "example.com/mode" not in _meta(kube_client, node)[0]

            # Someone else changes an owned key: the periodic read-back puts it right again.
            kube_client.patch(Node, node, {"metadata": {"annotations": {"example.com/usage": "tampered"}}},
                              patch_type=PatchType.MERGE)
            for _ in range(50):
                await asyncio.sleep(0.1)
                if _meta(kube_client, node)[1].get("example.com/usage") == '{"v":1}':
                    break
            assert _meta(kube_client, node)[1]["example.com/usage"] == '{"v":1}'
        finally:
            stop.set()
            await asyncio.wait_for(task, 5)
            await client.close()

    asyncio.run(scenario())


def test_own_node_without_rights_logs_and_keeps_running(control_plane: ControlPlane, namespace: str,
                                                        fake_node: Callable[..., str],
                                                        caplog: pytest.LogCaptureFixture) -> None:
    node = fake_node()
    token = control_plane.mint_token(namespace, "default")  # a default ServiceAccount may not touch Nodes

    async def scenario() -> None:
        client = AsyncClient(KubeConfig.from_file(control_plane.kubeconfig_for_token(token)))
        own = OwnNode(client, node, settle=0.01, backoff_initial=0.05, backoff_max=0.1)
        stop = asyncio.Event()
        task = asyncio.create_task(own.run(stop))
        own.want(labels={"example.com/mode": "4"})
        refused = logged_count(caplog, "could not update our Node")
        await until(lambda: refused() >= 3, "three refused attempts logged")  # it keeps retrying
        assert not task.done() and not own.in_sync.is_set() and own.writes == 0
        stop.set()
        await asyncio.wait_for(task, 5)
        await client.close()

    asyncio.run(scenario())
