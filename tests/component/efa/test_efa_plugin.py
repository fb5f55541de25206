"""The EFA device plugin as the daemon wires it (DevicePluginService with its declaration),
on fake hosts, against the kubelet stand-in over real unix sockets; and the real ``serve`` process."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import subprocess
import sys
from collections import Counter
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest
from accel_rig.kubelet_standin import KubeletStandIn, socket_files
from accel_rig.polling import until
from hostcache import copy_host
from prometheus_client import CollectorRegistry, generate_latest
from waits import logged

from accel_core.deviceplugin.daemon import DevicePluginService
from accel_core.fakehost import FakeHost, build_host, clear_host
from accel_core.kubeletapi import deviceplugin_v1beta1_pb2 as dp
from accel_core.kubeletapi import podresources_v1_pb2 as pr
from efa_plugin import RESOURCE_NAME, SOCKET_NAME
from efa_plugin.daemon import PLUGIN

REPO = Path(__file__).resolve().parents[3]


@dataclass
class Node:
    host: FakeHost
    standin: KubeletStandIn
    registry: CollectorRegistry


@contextlib.asynccontextmanager
async def node(short_tmp: Path, instance_type: str, *, efa: bool = True) -> AsyncIterator[Node]:
    host = copy_host(short_tmp / "h", instance_type, efa=efa)
    standin = KubeletStandIn(short_tmp / "k")
    await standin.start(pod_resources=True)
    registry = CollectorRegistry()
    paths = standin.paths(host_root=host.root)
    stop = asyncio.Event()
    task = asyncio.create_task(DevicePluginService(PLUGIN, paths, registry=registry, retry_interval=0.2).run(stop))
    try:
        yield Node(host, standin, registry)
    finally:
        stop.set()
        await asyncio.wait_for(task, 10)
        await standin.stop()


def run(coro: object) -> None:
    asyncio.run(coro)  # type: ignore[arg-type]


def healthy(devices: list[dp.Device]) -> dict[str, bool]:
    return {d.ID: d.health == "Healthy" for d in devices}


@pytest.mark.parametrize("instance_type, count", [("p4d.24xlarge", 4), ("p6-b200.48xlarge", 8), ("p5.48xlarge", 32)])
def test_registers_and_advertises_exact_counts(short_tmp: Path, instance_type: str, count: int) -> None:
    async def scenario() -> None:
        async with node(short_tmp, instance_type) as n:
            plugin = await n.standin.wait_registered(RESOURCE_NAME)
            assert plugin.endpoint.name == SOCKET_NAME
            assert plugin.options.get_preferred_allocation_available
            devices = await n.standin.wait_devices(RESOURCE_NAME, lambda d: len(d) == count)
            assert all(d.health == "Healthy" for d in devices)
            assert all(len(d.topology.nodes) == 1 and d.topology.nodes[0].ID in (0, 1) for d in devices)
            assert socket_files(n.standin.dp_dir) == sorted(["kubelet.sock", SOCKET_NAME])
    run(scenario())


def test_allocate_preferred_and_invalid_ids(short_tmp: Path) -> None:
    async def scenario() -> None:
        async with node(short_tmp, "p5.48xlarge") as n:
            host, standin = n.host, n.standin
            await standin.wait_registered(RESOURCE_NAME)
            devices = await standin.wait_devices(RESOURCE_NAME, lambda d: len(d) == 32)
            ids = sorted(d.ID for d in devices)
            resp = await standin.allocate(RESOURCE_NAME, ["0000:4f:00.0", "0000:50:00.0"], ["0000:c9:00.0"])
            first, second = resp.container_responses
            assert [(d.container_path, d.host_path, d.permissions) for d in first.devices] == [
                (f"/dev/infiniband/{host.uverbs_of(i)}",) * 2 + ("rw",) for i in ("rdmap79s0", "rdmap80s0")]
            assert [d.container_path for d in second.devices] == [f"/dev/infiniband/{host.uverbs_of('rdmap201s0')}"]
            for c in (first, second):
                assert not c.mounts and not c.envs and not c.annotations and not c.cdi_devices

            # p5: sorted IDs come in fours per GPU root (0000:4f-52 on pci0000:44, 0000:60-63 on pci0000:55, ...)
            root_of = {device_id: index // 4 for index, device_id in enumerate(ids)}
            got = await standin.preferred(RESOURCE_NAME, ids, [], 8)
            assert len(set(got)) == 8
            assert sorted(Counter(root_of[i] for i in got).values()) == [4, 4], "two whole roots"
            must = ["0000:a6:00.0"]
            got = await standin.preferred(RESOURCE_NAME, ids, must, 4)
            assert sorted(got) == ["0000:a4:00.0", "0000:a5:00.0", "0000:a6:00.0", "0000:a7:00.0"]

            with pytest.raises(grpc.aio.AioRpcError) as err:
                await standin.allocate(RESOURCE_NAME, ["0000:4f:00.0", "0000:ff:00.0"])
            assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert "0000:ff:00.0" in (err.value.details() or "")

            host.set_port_state("rdmap81s0", "DOWN")
            await standin.wait_devices(RESOURCE_NAME, lambda d: not healthy(d)["0000:51:00.0"])
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await standin.allocate(RESOURCE_NAME, ["0000:51:00.0"])
            assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert "0000:51:00.0" in (err.value.details() or "") and "unhealthy" in (err.value.details() or "")
    run(scenario())


def test_port_down_unhealthy_then_active_healthy(short_tmp: Path) -> None:
    async def scenario() -> None:
        async with node(short_tmp, "p5en.48xlarge") as n:
            await n.standin.wait_devices(RESOURCE_NAME, lambda d: len(d) == 16 and all(healthy(d).values()))
            n.host.set_port_state("rdmap119s0", "DOWN")
            devices = await n.standin.wait_devices(RESOURCE_NAME, lambda d: not all(healthy(d).values()))
            assert [i for i, ok in healthy(devices).items() if not ok] == ["0000:77:00.0"]
            assert len(devices) == 16
            n.host.set_port_state("rdmap119s0", "ACTIVE")
            await n.standin.wait_devices(RESOURCE_NAME, lambda d: all(healthy(d).values()))
            # a missing device node is Unhealthy too
            node_path = f"/dev/infiniband/{n.host.uverbs_of('rdmap120s0')}"
            n.host.remove_dev_node(node_path)
            devices = await n.standin.wait_devices(RESOURCE_NAME, lambda d: not all(healthy(d).values()))
            assert [i for i, ok in healthy(devices).items() if not ok] == ["0000:78:00.0"]
            n.host.restore_dev_node(node_path)
            await n.standin.wait_devices(RESOURCE_NAME, lambda d: all(healthy(d).values()))
    run(scenario())


def test_device_removed_and_restored(short_tmp: Path) -> None:
    async def scenario() -> None:
        async with node(short_tmp, "p4d.24xlarge") as n:
            await n.standin.wait_devices(RESOURCE_NAME, lambda d: len(d) == 4 and all(healthy(d).values()))
            n.host.remove_efa("rdmap144s27")
            devices = await n.standin.wait_devices(RESOURCE_NAME, lambda d: not healthy(d).get("0000:90:1b.0", True))
            assert len(devices) == 4, "a vanished device stays advertised, Unhealthy"
            n.host.restore_efa("rdmap144s27")
            await n.standin.wait_devices(RESOURCE_NAME, lambda d: len(d) == 4 and all(healthy(d).values()))
            resp = await n.standin.allocate(RESOURCE_NAME, ["0000:90:1b.0"])
            uverbs = n.host.uverbs_of("rdmap144s27")
            assert [d.container_path for d in resp.container_responses[0].devices] == [f"/dev/infiniband/{uverbs}"]
    run(scenario())


def test_no_efa_node_registers_when_devices_appear(short_tmp: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="accel_core.deviceplugin.pluginserver")

    async def scenario() -> None:
        async with node(short_tmp, "p4d.24xlarge", efa=False) as n:
            await until(logged(caplog, "no devices to advertise"), "the decision not to serve")
            assert socket_files(n.standin.dp_dir) == ["kubelet.sock"]
            assert n.standin.registrations == []
            clear_host(n.host.root)
            build_host(n.host.root, "p4d.24xlarge")  # EFA attached now
            await n.standin.wait_registered(RESOURCE_NAME, timeout=10)
            await n.standin.wait_devices(RESOURCE_NAME, lambda d: len(d) == 4 and all(healthy(d).values()))
    run(scenario())


def test_reregisters_after_kubelet_restart(short_tmp: Path) -> None:
    async def scenario() -> None:
        async with node(short_tmp, "p4d.24xlarge") as n:
            await n.standin.wait_registered(RESOURCE_NAME)
            await n.standin.restart()
            await n.standin.wait_registered(RESOURCE_NAME, count=2)
            await n.standin.wait_devices(RESOURCE_NAME, lambda d: len(d) == 4)
    run(scenario())


def test_metrics_scrape(short_tmp: Path) -> None:
    async def scenario() -> None:
        async with node(short_tmp, "p5.48xlarge") as n:
            await n.standin.wait_devices(RESOURCE_NAME, lambda d: len(d) == 32)
            await n.standin.allocate(RESOURCE_NAME, ["0000:4f:00.0"])
            n.standin.pod_resources = [pr.PodResources(name="trainer", namespace="ml", containers=[
                pr.ContainerResources(name="main", devices=[
                    pr.ContainerDevices(resource_name=RESOURCE_NAME, device_ids=["0000:4f:00.0"]),
                    pr.ContainerDevices(resource_name="nvidia.com/gpu", device_ids=["GPU-1"]),
                ])])]
            n.host.set_efa_counter("rdmap79s0", "unresponsive_remote_events", 9, port=1)
            n.host.set_port_state("rdmap80s0", "DOWN")
            await n.standin.wait_devices(RESOURCE_NAME, lambda d: not healthy(d)["0000:50:00.0"])
            # the scrape asks the stand-in's PodResources service, which runs on this loop: scrape from a thread
            text = (await asyncio.to_thread(generate_latest, n.registry)).decode()
            base = 'device="rdmap79s0",numa_node="0",pci_address="0000:4f:00.0"'
            for line in (
                f'efa_port_unresponsive_remote_events_total{{{base},port="1"}} 9.0',
                f"efa_device_allocated{{{base}}} 1.0",
                f"efa_device_allocations_total{{{base}}} 1.0",
                f"efa_device_healthy{{{base}}} 1.0",
                'efa_device_healthy{device="rdmap80s0",numa_node="0",pci_address="0000:50:00.0"} 0.0',
                'efa_port_active{device="rdmap80s0",numa_node="0",pci_address="0000:50:00.0",port="1"} 0.0',
                'efa_device_allocated{device="rdmap80s0",numa_node="0",pci_address="0000:50:00.0"} 0.0',
                f'accel_device_plugin_registered{{resource="{RESOURCE_NAME}"}} 1.0',
            ):
                assert line in text, line
            assert n.standin.pod_resources_calls >= 1
    run(scenario())


def test_serve_process_registers_and_stops_cleanly_on_sigterm(short_tmp: Path) -> None:
    async def scenario() -> None:
        host = copy_host(short_tmp / "h", "p4d.24xlarge")
        standin = KubeletStandIn(short_tmp / "k")
        await standin.start()
        env = {**os.environ, "PYTHONPATH": str(REPO)}
        proc = subprocess.Popen(
            [sys.executable, "-m", "efa_plugin.cli", "serve", "--host-root", str(host.root),
             *standin.daemon_flags(), "--metrics-port", "0"],
            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        )
        try:
            await standin.wait_registered(RESOURCE_NAME, timeout=30)
            await standin.wait_devices(RESOURCE_NAME, lambda d: len(d) == 4)
            assert (standin.dp_dir / SOCKET_NAME).exists()
            proc.send_signal(signal.SIGTERM)
            code = await asyncio.to_thread(proc.wait, 20)
            stderr = proc.stderr.read().decode() if proc.stderr else ""
            assert code == 0, stderr
            assert not (standin.dp_dir / SOCKET_NAME).exists()
            assert "registered with kubelet" in stderr and "EFA device found" in stderr
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            await standin.stop()
    run(scenario())
