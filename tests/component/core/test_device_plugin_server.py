"""The generic device-plugin server against the kubelet stand-in, over real unix sockets."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Sequence
from pathlib import Path

import grpc
import pytest
from accel_rig.kubelet_standin import KubeletStandIn, socket_files
from accel_rig.polling import until
from waits import logged

from accel_core.deviceplugin import AdvertisedDevice, AllocationError, DevicePluginServer
from accel_core.edits import ContainerEdits, DeviceNode

RESOURCE = "example.com/widget"


class ListPolicy:
    """A tiny policy over a mutable device list."""

    resource_name = RESOURCE
    socket_name = "widget.sock"

    def __init__(self, n: int) -> None:
        self.items = [AdvertisedDevice(f"w{i}", True, i % 2) for i in range(n)]
        self.blocked: str | None = None

    def devices(self) -> Sequence[AdvertisedDevice]:
        return list(self.items)

    def advertise_blocked(self) -> str | None:
        return self.blocked

    def preferred(self, available: Sequence[str], must_include: Sequence[str], size: int) -> list[str]:
        out = list(must_include)
        out += [a for a in sorted(available, reverse=True) if a not in out][: size - len(out)]
        return out

    def allocate(self, ids: Sequence[str]) -> ContainerEdits:
        if "w13" in ids:
            raise AllocationError("w13 is cursed")
        nodes = tuple(DeviceNode(f"/dev/widget/{i}") for i in ids)
        return ContainerEdits(device_nodes=nodes, env=(("WIDGETS", ",".join(ids)),))


@contextlib.asynccontextmanager
async def running(
    short_tmp: Path, policy: ListPolicy, *, kubelet: bool = True
) -> AsyncIterator[tuple[KubeletStandIn, DevicePluginServer]]:
    standin = KubeletStandIn(short_tmp / "kubelet")
    standin.dp_dir.mkdir(parents=True)
    if kubelet:
        await standin.start()
    server = DevicePluginServer(policy, standin.paths(), retry_interval=0.2)
    stop = asyncio.Event()
    task = asyncio.create_task(server.run(stop))
    try:
        yield standin, server
    finally:
        stop.set()
        await asyncio.wait_for(task, 5)
        await standin.stop()


def run(coro: object) -> None:
    asyncio.run(coro)  # type: ignore[arg-type]


def test_registers_after_serving_and_streams_full_list(short_tmp: Path) -> None:
    async def scenario() -> None:
        policy = ListPolicy(4)
        async with running(short_tmp, policy) as (standin, server):
            plugin = await standin.wait_registered(RESOURCE)
            assert plugin.endpoint.name == "widget.sock"
            assert plugin.options.get_preferred_allocation_available
            devs = await standin.wait_devices(RESOURCE, lambda d: len(d) == 4)
            assert {d.ID for d in devs} == {"w0", "w1", "w2", "w3"}
            assert all(d.health == "Healthy" for d in devs)
            assert [n.ID for n in devs[1].topology.nodes] == [1]
    run(scenario())


def test_health_changes_both_ways(short_tmp: Path) -> None:
    async def scenario() -> None:
        policy = ListPolicy(3)
        async with running(short_tmp, policy) as (standin, server):
            await standin.wait_registered(RESOURCE)
            await standin.wait_devices(RESOURCE, lambda d: len(d) == 3)
            policy.items[1] = AdvertisedDevice("w1", False, 1)
            assert await server.refresh()
            devs = await standin.wait_devices(RESOURCE, lambda d: any(x.health == "Unhealthy" for x in d))
            assert [d.ID for d in devs if d.health == "Unhealthy"] == ["w1"]
            policy.items[1] = AdvertisedDevice("w1", True, 1)
            await server.refresh()
            await standin.wait_devices(RESOURCE, lambda d: all(x.health == "Healthy" for x in d))
            assert not await server.refresh(), "no change must not send an update"
    run(scenario())


def test_allocate_and_errors(short_tmp: Path) -> None:
    async def scenario() -> None:
        policy = ListPolicy(16)
        async with running(short_tmp, policy) as (standin, server):
            await standin.wait_registered(RESOURCE)
            await standin.wait_devices(RESOURCE, lambda d: len(d) == 16)
            resp = await standin.allocate(RESOURCE, ["w1", "w2"], ["w3"])
            paths = [d.container_path for d in resp.container_responses[0].devices]
            assert paths == ["/dev/widget/w1", "/dev/widget/w2"]
            assert resp.container_responses[1].envs["WIDGETS"] == "w3"
            assert resp.container_responses[0].devices[0].permissions == "rw"
            for bad, needle in ((["nope"], "'nope'"), (["w13"], "cursed")):
                with pytest.raises(grpc.aio.AioRpcError) as err:
                    await standin.allocate(RESOURCE, bad)
                assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
                assert needle in (err.value.details() or "")
            policy.items[5] = AdvertisedDevice("w5", False)
            await server.refresh()
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await standin.allocate(RESOURCE, ["w5"])
            assert "unhealthy" in (err.value.details() or "")
            assert await standin.preferred(RESOURCE, ["w1", "w2", "w3"], ["w1"], 2) == ["w1", "w3"]
    run(scenario())


def test_reregisters_after_kubelet_restart_and_socket_deletion(short_tmp: Path) -> None:
    async def scenario() -> None:
        policy = ListPolicy(2)
        async with running(short_tmp, policy) as (standin, server):
            await standin.wait_registered(RESOURCE)
            await standin.restart()  # deletes every socket, ours included, then listens again
            await standin.wait_registered(RESOURCE, count=2, timeout=2.0)
            await standin.wait_devices(RESOURCE, lambda d: len(d) == 2)
            assert "widget.sock" in socket_files(standin.dp_dir)
            server.socket_path.unlink()  # someone removes only our socket
            await standin.wait_registered(RESOURCE, count=3, timeout=3.0)
            assert "widget.sock" in socket_files(standin.dp_dir)
    run(scenario())


def test_waits_for_absent_kubelet_and_no_devices(short_tmp: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="accel_core.deviceplugin.pluginserver")

    async def scenario() -> None:
        policy = ListPolicy(0)
        async with running(short_tmp, policy, kubelet=False) as (standin, server):
            await until(logged(caplog, "no devices to advertise"), "the first reconcile")
            assert socket_files(standin.dp_dir) == [], "nothing to advertise: must not serve"
            policy.items = [AdvertisedDevice("w0")]
            await server.refresh()
            await until(logged(caplog, "waiting for the kubelet"), "the reconcile that serves")
            assert socket_files(standin.dp_dir) == ["widget.sock"], "serves once devices exist, kubelet or not"
            await standin.start()
            await standin.wait_registered(RESOURCE, timeout=3.0)
            await standin.wait_devices(RESOURCE, lambda d: [x.ID for x in d] == ["w0"])
    run(scenario())


def test_blocked_policy_advertises_nothing(short_tmp: Path) -> None:
    async def scenario() -> None:
        policy = ListPolicy(2)
        async with running(short_tmp, policy) as (standin, server):
            await standin.wait_devices(RESOURCE, lambda d: len(d) == 2)
            policy.blocked = "another driver owns these devices"
            await server.refresh()
            await standin.wait_devices(RESOURCE, lambda d: d == [])
    run(scenario())


def test_graceful_stop_removes_socket(short_tmp: Path) -> None:
    async def scenario() -> None:
        policy = ListPolicy(1)
        async with running(short_tmp, policy) as (standin, server):
            await standin.wait_registered(RESOURCE)
            assert server.socket_path.exists()
        assert not server.socket_path.exists()
    run(scenario())


def test_policy_errors_keep_the_last_list_and_the_server_alive(short_tmp: Path) -> None:
    class Flaky(ListPolicy):
        broken = False

        def devices(self) -> Sequence[AdvertisedDevice]:
            if self.broken:
                raise OSError("sysfs went away mid-read")
            return super().devices()

    async def scenario() -> None:
        policy = Flaky(2)
        async with running(short_tmp, policy) as (standin, server):
            await standin.wait_devices(RESOURCE, lambda d: len(d) == 2)
            policy.broken = True
            assert not await server.refresh()
            assert [d.id for d in server.devices] == ["w0", "w1"]
            policy.broken = False
            policy.items.append(AdvertisedDevice("w2"))
            assert await server.refresh()
            await standin.wait_devices(RESOURCE, lambda d: len(d) == 3)
    run(scenario())
