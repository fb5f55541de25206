"""The one PodResources client both device plugins use, against a kubelet stand-in serving PodResources v1 List
over a real unix socket: IDs per resource across pods and containers, a clear error without a kubelet, and
the kubelet found again after it restarts (a new socket at the same path)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from accel_rig.kubelet_standin import KubeletStandIn

from accel_core.kubeletapi import podresources_v1_pb2 as pr
from accel_core.podresources import PodResourcesClient, PodResourcesUnavailable

EFA = "vpc.amazonaws.com/efa"
NEURON = "aws.amazon.com/neuron"


def pod(name: str, *held: tuple[str, list[str]]) -> pr.PodResources:
    containers = [pr.ContainerResources(name=f"c{i}", devices=[pr.ContainerDevices(resource_name=r, device_ids=ids)])
                  for i, (r, ids) in enumerate(held)]
    return pr.PodResources(name=name, namespace="ns", containers=containers)


def test_in_use_per_resource_and_kubelet_restarts(short_tmp: Path) -> None:
    async def scenario() -> None:
        standin = KubeletStandIn(short_tmp / "kubelet")
        client = PodResourcesClient(standin.root / "pod-resources" / "kubelet.sock", timeout=2)
        with pytest.raises(PodResourcesUnavailable, match="not present"):
            await client.in_use_async([EFA])
        standin.pod_resources = [pod("a", (EFA, ["efa0"]), (EFA, ["efa1"])), pod("b", (NEURON, ["3"]))]
        await standin.start(pod_resources=True)
        try:
            assert await client.in_use_async([EFA, NEURON]) == {EFA: {"efa0", "efa1"}, NEURON: {"3"}}
            await standin.stop()
            with pytest.raises(PodResourcesUnavailable):
                await client.in_use_async([EFA])
            standin.pod_resources = [pod("d", (EFA, ["efa2"]))]
            await standin.start(pod_resources=True)
            assert await client.in_use_async([EFA]) == {EFA: {"efa2"}}
            assert standin.pod_resources_calls >= 1
            assert await asyncio.to_thread(client.in_use, [EFA]) == {EFA: {"efa2"}}, "the blocking call agrees"
        finally:
            client.close()
            await client.aclose()
            await standin.stop()

    asyncio.run(scenario())
