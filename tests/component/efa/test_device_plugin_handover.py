"""The device plugin's side of the coexistence rule (the DRA driver wins), with the EFA device plugin as the daemon
wires it (DevicePluginService), on a fake p5.48xlarge, against the kubelet stand-in (registration and PodResources)
over real unix sockets. The DRA driver is played by its presence file and PodResources ``dynamic_resources``, as the
kubelet reports a running pod's claims (kubelet-apis.md: ClaimResource driver_name, pool_name, device_name)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import time
import urllib.error
import urllib.request
from collections.abc import AsyncIterator
from pathlib import Path

from accel_rig.kubelet_standin import KubeletStandIn
from hostcache import copy_host
from prometheus_client import CollectorRegistry

from accel_core.coexistence import write_presence
from accel_core.deviceplugin.daemon import DevicePluginService
from accel_core.kubeletapi import deviceplugin_v1beta1_pb2 as dp
from accel_core.kubeletapi import podresources_v1_pb2 as pr
from accel_core.paths import HostPaths
from efa_plugin import RESOURCE_NAME
from efa_plugin.daemon import PLUGIN

#: The EFA DRA driver's name for the EFA at PCI address 0000:4f:00.0 (rdmap79s0 on p5.48xlarge), whose
#: device-plugin ID is that PCI address (docs/efa-dra-driver.md, docs/efa-device-plugin.md).
DRA_NAME, DP_ID = "efa-0000-4f-00-0", "0000:4f:00.0"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _readyz(port: int) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=5) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def _presence(paths: HostPaths, age: float = 0.0) -> Path:
    path = paths.plugins_data_dir / "efa.aws.com" / "serving.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    write_presence(path, pod_uid="", node="n1")
    os.utime(path, (time.time() - age, time.time() - age))
    return path


def _claim_holding(device: str) -> pr.PodResources:
    return pr.PodResources(name="dra-workload", namespace="ml", containers=[pr.ContainerResources(
        name="main", dynamic_resources=[pr.DynamicResource(claim_name="c", claim_namespace="ml", claim_resources=[
            pr.ClaimResource(driver_name="efa.aws.com", pool_name="n1", device_name=device)])])])


@contextlib.asynccontextmanager
async def plugin(short_tmp: Path, port: int) -> AsyncIterator[tuple[KubeletStandIn, HostPaths]]:
    host = copy_host(short_tmp / "h", "p5.48xlarge")
    standin = KubeletStandIn(short_tmp / "k")
    await standin.start(pod_resources=True)
    paths = standin.paths(host_root=host.root)
    yield standin, paths
    await standin.stop()


async def _run(paths: HostPaths, port: int, stop: asyncio.Event) -> asyncio.Task[None]:
    return asyncio.create_task(DevicePluginService(PLUGIN, paths, registry=CollectorRegistry(), retry_interval=0.2,
                                                   metrics_port=port).run(stop))


def _health(devices: list[dp.Device]) -> dict[str, str]:
    return {d.ID: d.health for d in devices}


def test_the_plugin_stands_down_for_a_restarting_driver_and_serves_when_it_leaves(short_tmp: Path) -> None:
    port = _free_port()

    async def scenario() -> None:
        async with plugin(short_tmp, port) as (standin, paths):
            presence = _presence(paths)  # a DRA driver whose pod is being re-created: no registration socket
            standin.pod_resources = [_claim_holding(DRA_NAME)]  # a running pod holds one EFA through a DRA claim
            stop = asyncio.Event()
            task = await _run(paths, port, stop)
            try:
                await asyncio.sleep(1.5)
                assert RESOURCE_NAME not in standin.plugins, "registered while the DRA driver serves the node"
                status, body = await asyncio.to_thread(_readyz, port)
                assert status == 503 and "efa.aws.com" in body and "restarting" in body, body
                presence.unlink()  # the driver left the node for good (uninstalled)
                devices = await standin.wait_devices(RESOURCE_NAME, lambda d: len(d) == 32)
                health = _health(devices)
                assert health[DP_ID] == "Unhealthy", "an EFA a DRA claim holds was advertised as free"
                assert list(health.values()).count("Healthy") == 31
                assert (await asyncio.to_thread(_readyz, port))[0] == 200
                standin.pod_resources = []  # that pod ended: the EFA is free within the recheck (5 s)
                await standin.wait_devices(RESOURCE_NAME, lambda d: _health(d).get(DP_ID) == "Healthy", timeout=10)
            finally:
                stop.set()
                await asyncio.wait_for(task, 10)

    asyncio.run(scenario())


def test_the_plugin_takes_over_when_the_lease_runs_out(short_tmp: Path) -> None:
    """A driver that died and did not come back: its presence file stops being refreshed, and the plugin serves
    again once the 45 s lease has passed, with no file event to wake it."""
    port = _free_port()

    async def scenario() -> None:
        async with plugin(short_tmp, port) as (standin, paths):
            _presence(paths, age=42.5)  # 2.5 s of the lease left
            stop = asyncio.Event()
            task = await _run(paths, port, stop)
            try:
                await asyncio.sleep(1.0)
                assert RESOURCE_NAME not in standin.plugins
                started = time.monotonic()
                await standin.wait_devices(RESOURCE_NAME, lambda d: len(d) == 32, timeout=10)
                assert time.monotonic() - started < 5, "the plugin did not wake when the lease ran out"
            finally:
                stop.set()
                await asyncio.wait_for(task, 10)

    asyncio.run(scenario())
