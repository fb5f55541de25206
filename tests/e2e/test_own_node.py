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

from accel_core.dra.nodelabels import NodeLabelWatch
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


def test_own_node_fed_by_the_drivers_node_watch_puts_a_tampered_key_back_at_once(
        control_plane: ControlPlane, kube_client: Client, fake_node: Callable[..., str]) -> None:
    """Fed by the Node watch the DRA driver keeps for its label attributes, OwnNode sends no GET: the watch's copies
    are its read-back, so a key someone else changes is put back within seconds, not at the next 300 s re-read."""
    node = fake_node()

    async def scenario() -> None:
        client = AsyncClient(KubeConfig.from_file(control_plane.admin_kubeconfig))
        gets = 0
        real_get = client.get

        async def counted_get(*args: Any, **kwargs: Any) -> Any:
            nonlocal gets
            gets += 1
            return await real_get(*args, **kwargs)

        own = OwnNode(client, node, settle=0.05)  # the default 300 s re-read
        watch = NodeLabelWatch(client, node, {}, lambda: None)
        watch.observers.append(own.observe)
        client.get = counted_get  # type: ignore[method-assign]
        stop = asyncio.Event()
        tasks = [asyncio.create_task(watch.run(stop))]
        try:
            await asyncio.wait_for(watch.read.wait(), 10)
            tasks.append(asyncio.create_task(own.run(stop)))
            own.want(labels={"example.com/mode": "4"})
            await until(lambda: _meta(kube_client, node)[0].get("example.com/mode") == "4", "the label written",
                        timeout=10, interval=0.2)
            kube_client.patch(Node, node, {"metadata": {"labels": {"example.com/mode": "tampered"}}},
                              patch_type=PatchType.MERGE)
            await until(lambda: _meta(kube_client, node)[0].get("example.com/mode") == "4", "the label put back",
                        timeout=15, interval=0.2)  # the 300 s re-read would come far later
            assert gets == 1, "only the watch's first read"
        finally:
            stop.set()
            await asyncio.wait_for(asyncio.gather(*tasks), 5)
            await client.close()

    asyncio.run(scenario())
