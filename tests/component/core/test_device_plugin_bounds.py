"""Issue 25 item 3: a kubelet call is bounded by the node's devices before a policy sees it (real sockets)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Sequence
from pathlib import Path

import grpc
import pytest
from accel_rig.kubelet_standin import KubeletStandIn

from accel_core.deviceplugin import AdvertisedDevice, DevicePluginServer
from accel_core.edits import ContainerEdits
from accel_core.kubeletapi import deviceplugin_v1beta1_pb2 as pb

RESOURCE = "example.com/widget"
DEVICES = 16


class RecordingPolicy:
    """Prefers the first ``size`` IDs and remembers what it was asked."""

    resource_name = RESOURCE
    socket_name = "widget.sock"

    def __init__(self) -> None:
        self.asked: list[tuple[list[str], list[str], int]] = []
        self.allocated: list[list[str]] = []

    def devices(self) -> Sequence[AdvertisedDevice]:
        return [AdvertisedDevice(f"w{i}") for i in range(DEVICES)]

    def advertise_blocked(self) -> str | None:
        return None

    def preferred(self, available: Sequence[str], must_include: Sequence[str], size: int) -> list[str]:
        self.asked.append((list(available), list(must_include), size))
        out = list(must_include)
        return (out + [a for a in available if a not in out])[:size]

    def allocate(self, ids: Sequence[str]) -> ContainerEdits:
        self.allocated.append(list(ids))
        return ContainerEdits()


@contextlib.asynccontextmanager
async def running(short_tmp: Path) -> AsyncIterator[tuple[KubeletStandIn, RecordingPolicy]]:
    standin = KubeletStandIn(short_tmp / "kubelet")
    await standin.start()
    policy = RecordingPolicy()
    server = DevicePluginServer(policy, standin.paths(), retry_interval=0.2)
    stop = asyncio.Event()
    task = asyncio.create_task(server.run(stop))
    try:
        await standin.wait_registered(RESOURCE)
        await standin.wait_devices(RESOURCE, lambda d: len(d) == DEVICES)
        yield standin, policy
    finally:
        stop.set()
        await asyncio.wait_for(task, 5)
        await standin.stop()


async def refused(call: object) -> grpc.aio.AioRpcError:
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await call  # type: ignore[misc]
    return err.value


ALL = [f"w{i}" for i in range(DEVICES)]


def test_preferred_sizes_and_lists_beyond_the_node_are_refused(short_tmp: Path) -> None:
    async def scenario() -> None:
        async with running(short_tmp) as (standin, policy):
            for size in (DEVICES + 1, 1_000_000, 2**31 - 1, -1):
                err = await refused(standin.preferred(RESOURCE, ALL, [], size))
                assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
                assert f"allocation_size {size}" in (err.details() or "")
                assert "container request 0" in (err.details() or "")
            err = await refused(standin.preferred(RESOURCE, ALL + ["w0"], [], 2))
            assert "17 available_deviceIDs" in (err.details() or "")
            err = await refused(standin.preferred(RESOURCE, ALL, [f"x{i}" for i in range(DEVICES + 1)], 2))
            assert "must_include_deviceIDs" in (err.details() or "")
            assert policy.asked == [], "nothing unbounded reached the policy"
            # a node-sized request is answered
            assert await standin.preferred(RESOURCE, ALL, [], DEVICES) == ALL
    asyncio.run(scenario())


def test_unknown_must_include_is_refused_not_echoed(short_tmp: Path) -> None:
    async def scenario() -> None:
        async with running(short_tmp) as (standin, policy):
            err = await refused(standin.preferred(RESOURCE, ["w1", "w2"], ["ghost"], 2))
            assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert "'ghost'" in (err.details() or "") and "must_include_deviceIDs" in (err.details() or "")
            # an available ID the node does not have is not offered to the policy (nor answered)
            got = await standin.preferred(RESOURCE, ["zz", "w3"], [], 1)
            assert got == ["w3"] and policy.asked[-1][0] == ["w3"]
    asyncio.run(scenario())


def test_allocate_beyond_the_node_is_refused(short_tmp: Path) -> None:
    async def scenario() -> None:
        async with running(short_tmp) as (standin, policy):
            err = await refused(standin.allocate(RESOURCE, ALL + ["w0"]))
            assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert "Allocate container request 0" in (err.details() or "")
            assert policy.allocated == []
    asyncio.run(scenario())


def test_an_oversized_message_is_refused_by_the_transport(short_tmp: Path) -> None:
    async def scenario() -> None:
        async with running(short_tmp) as (standin, policy):
            # 300,000 IDs (~1.5 MB): gRPC's default 4 MB limit let such calls reach the handler
            many = [str(i) for i in range(300_000)]
            req = pb.PreferredAllocationRequest(container_requests=[pb.ContainerPreferredAllocationRequest(
                available_deviceIDs=many, allocation_size=1)])
            err = await refused(standin.plugins[RESOURCE].stub.GetPreferredAllocation(req))
            assert err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            assert policy.asked == []
    asyncio.run(scenario())
