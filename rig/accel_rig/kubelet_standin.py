"""A small KUBELET STAND-IN for component tests and the demo. It is not the kubelet.

It plays the kubelet's side of the plugin APIs over real unix sockets, as the facts in kubelet-apis.md describe:
- device plugins: serves ``Registration`` on ``device-plugins/kubelet.sock``; on Register it dials the plugin's
  endpoint, calls GetDevicePluginOptions, and follows its ListAndWatch stream; ``restart()`` deletes every socket
  in the directory (as a kubelet start does) and listens again;
- DRA: ``register_dra()`` finds ``*-reg.sock`` in plugins_registry, calls GetInfo, picks the first version it
  supports from the plugin's list, calls NotifyRegistrationStatus, and then talks to the DRA endpoint;
- pod resources: serves ``PodResourcesLister.List`` from a list the test sets.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc

from accel_core.grpc_types import Ctx
from accel_core.kubeletapi import deviceplugin_v1beta1_pb2 as dp
from accel_core.kubeletapi import deviceplugin_v1beta1_pb2_grpc as dp_grpc
from accel_core.kubeletapi import dra_health_v1alpha1_pb2 as hp
from accel_core.kubeletapi import dra_health_v1alpha1_pb2_grpc as hp_grpc
from accel_core.kubeletapi import dra_v1_pb2 as d1
from accel_core.kubeletapi import dra_v1_pb2_grpc as d1_grpc
from accel_core.kubeletapi import dra_v1beta1_pb2 as d1b
from accel_core.kubeletapi import dra_v1beta1_pb2_grpc as d1b_grpc
from accel_core.kubeletapi import pluginregistration_v1_pb2 as rp
from accel_core.kubeletapi import pluginregistration_v1_pb2_grpc as rp_grpc
from accel_core.kubeletapi import podresources_v1_pb2 as pr
from accel_core.kubeletapi import podresources_v1_pb2_grpc as pr_grpc
from accel_core.paths import HostPaths

KUBELET_DRA_SERVICES = ("v1.DRAPlugin", "v1beta1.DRAPlugin")


@dataclass
class PluginEndpoint:
    """What the stand-in knows about one registered device plugin."""

    resource: str
    endpoint: Path
    options: dp.DevicePluginOptions
    channel: grpc.aio.Channel
    stub: dp_grpc.DevicePluginStub
    devices: list[dp.Device] = field(default_factory=list)
    updates: int = 0
    changed: asyncio.Event = field(default_factory=asyncio.Event)
    stream_task: asyncio.Task[None] | None = None
    stream_ended: bool = False


class _Registration(dp_grpc.RegistrationServicer):
    def __init__(self, owner: KubeletStandIn) -> None:
        self._owner = owner

    async def Register(self, request: dp.RegisterRequest, context: Ctx) -> dp.Empty:  # noqa: N802
        if request.version != "v1beta1":
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"unsupported version {request.version}")
        if "/" not in request.resource_name:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"not an extended resource: {request.resource_name}")
        await self._owner._connect_plugin(request)
        return dp.Empty()


class _PodResources(pr_grpc.PodResourcesListerServicer):
    def __init__(self, owner: KubeletStandIn) -> None:
        self._owner = owner

    async def List(self, request: pr.ListPodResourcesRequest, context: Ctx) -> pr.ListPodResourcesResponse:  # noqa: N802
        self._owner.pod_resources_calls += 1
        return pr.ListPodResourcesResponse(pod_resources=list(self._owner.pod_resources))


class KubeletStandIn:
    """Kubelet stand-in rooted at ``kubelet_root`` (a temp dir in tests)."""

    def __init__(self, kubelet_root: Path) -> None:
        self.root = Path(kubelet_root)
        self.dp_dir = self.root / "device-plugins"
        self.registry_dir = self.root / "plugins_registry"
        self.plugins: dict[str, PluginEndpoint] = {}
        self.registrations: list[str] = []
        self.registered = asyncio.Condition()
        self.pod_resources: list[pr.PodResources] = []
        self.pod_resources_calls = 0
        self._server: grpc.aio.Server | None = None
        self._pr_server: grpc.aio.Server | None = None

    def paths(self, **kwargs: Any) -> HostPaths:
        """HostPaths of a daemon under this stand-in (kubelet root and device-plugins dir both inside it)."""
        return HostPaths(kubelet_root=self.root, device_plugins=self.dp_dir, **kwargs)

    def daemon_flags(self) -> list[str]:
        """The path flags a daemon started as a process needs to find this stand-in."""
        return ["--kubelet-root", str(self.root), "--device-plugins-dir", str(self.dp_dir)]

    # -- device-plugin side ----------------------------------------------------------------------------------------
    async def start(self, *, pod_resources: bool = False) -> None:
        self.dp_dir.mkdir(parents=True, exist_ok=True)
        self.registry_dir.mkdir(parents=True, exist_ok=True)
        server = grpc.aio.server()
        dp_grpc.add_RegistrationServicer_to_server(_Registration(self), server)
        server.add_insecure_port(f"unix://{self.dp_dir / 'kubelet.sock'}")
        await server.start()
        self._server = server
        if pod_resources and self._pr_server is None:
            (self.root / "pod-resources").mkdir(parents=True, exist_ok=True)
            prs = grpc.aio.server()
            pr_grpc.add_PodResourcesListerServicer_to_server(_PodResources(self), prs)
            prs.add_insecure_port(f"unix://{self.root / 'pod-resources' / 'kubelet.sock'}")
            await prs.start()
            self._pr_server = prs

    async def stop(self) -> None:
        for plugin in list(self.plugins.values()):
            await self._drop(plugin)
        self.plugins.clear()
        for server in (self._server, self._pr_server):
            if server is not None:
                await server.stop(None)
        self._server = self._pr_server = None
        with contextlib.suppress(FileNotFoundError):
            (self.dp_dir / "kubelet.sock").unlink()

    async def restart(self) -> None:
        """Behave like a kubelet start: drop plugins, delete every socket in device-plugins/, listen again."""
        for plugin in list(self.plugins.values()):
            await self._drop(plugin)
        self.plugins.clear()
        if self._server is not None:
            await self._server.stop(None)
            self._server = None
        for entry in self.dp_dir.iterdir():  # files, not sub-directories, as the kubelet's clean-up does
            if entry.name != "kubelet_internal_checkpoint" and not entry.is_dir():
                with contextlib.suppress(FileNotFoundError):
                    entry.unlink()
        await self.start()

    async def _connect_plugin(self, request: dp.RegisterRequest) -> None:
        old = self.plugins.pop(request.resource_name, None)
        if old is not None:
            await self._drop(old)
        endpoint = self.dp_dir / request.endpoint
        channel = grpc.aio.insecure_channel(f"unix://{endpoint}")
        stub = dp_grpc.DevicePluginStub(channel)
        options = await stub.GetDevicePluginOptions(dp.Empty(), timeout=10)
        plugin = PluginEndpoint(request.resource_name, endpoint, options, channel, stub)
        plugin.stream_task = asyncio.create_task(self._follow(plugin))
        self.plugins[request.resource_name] = plugin
        async with self.registered:
            self.registrations.append(request.resource_name)
            self.registered.notify_all()

    async def _follow(self, plugin: PluginEndpoint) -> None:
        try:
            async for msg in plugin.stub.ListAndWatch(dp.Empty()):
                plugin.devices = list(msg.devices)
                plugin.updates += 1
                plugin.changed.set()
        except (grpc.aio.AioRpcError, asyncio.CancelledError):
            pass
        finally:
            plugin.stream_ended = True
            plugin.changed.set()

    async def _drop(self, plugin: PluginEndpoint) -> None:
        if plugin.stream_task is not None:
            plugin.stream_task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await plugin.stream_task
        await plugin.channel.close(None)

    async def wait_registered(self, resource: str, count: int = 1, timeout: float = 10.0) -> PluginEndpoint:
        """Wait until ``resource`` has registered ``count`` times in total."""
        async with self.registered:
            await asyncio.wait_for(
                self.registered.wait_for(lambda: self.registrations.count(resource) >= count), timeout)
        return self.plugins[resource]

    async def wait_devices(self, resource: str, predicate: object, timeout: float = 5.0) -> list[dp.Device]:
        """Wait until the plugin's latest list satisfies ``predicate(list[Device]) -> bool``."""
        assert callable(predicate)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while True:
            plugin = self.plugins.get(resource)
            if plugin is not None:
                if plugin.updates and predicate(plugin.devices):
                    return plugin.devices
                plugin.changed.clear()
                remaining = deadline - loop.time()
                if remaining <= 0:
                    raise TimeoutError(f"{resource}: device list never matched; last={plugin.devices}")
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(plugin.changed.wait(), min(remaining, 0.5))
            else:
                if loop.time() > deadline:
                    raise TimeoutError(f"{resource} never registered")
                await asyncio.sleep(0.02)

    async def allocate(self, resource: str, *containers: list[str]) -> dp.AllocateResponse:
        req = dp.AllocateRequest(container_requests=[dp.ContainerAllocateRequest(devices_ids=c) for c in containers])
        resp: dp.AllocateResponse = await self.plugins[resource].stub.Allocate(req)
        return resp

    async def preferred(self, resource: str, available: list[str], must: list[str], size: int) -> list[str]:
        req = dp.PreferredAllocationRequest(container_requests=[dp.ContainerPreferredAllocationRequest(
            available_deviceIDs=available, must_include_deviceIDs=must, allocation_size=size)])
        resp = await self.plugins[resource].stub.GetPreferredAllocation(req)
        return list(resp.container_responses[0].deviceIDs)

    # -- DRA side --------------------------------------------------------------------------------------------------
    async def register_dra(self, driver: str, timeout: float = 10.0) -> DraConnection:
        """Find the driver's registration socket, run the kubelet's registration handshake, connect to its endpoint."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while True:
            socks = sorted(p for p in self.registry_dir.glob(f"{driver}*-reg.sock") if not p.name.startswith("."))
            if socks:
                break
            if loop.time() > deadline:
                raise TimeoutError(f"no registration socket for {driver} in {self.registry_dir}")
            await asyncio.sleep(0.05)
        async with grpc.aio.insecure_channel(f"unix://{socks[-1]}") as channel:
            reg = rp_grpc.RegistrationStub(channel)
            info = await reg.GetInfo(rp.InfoRequest(), timeout=1)
            chosen = next((v for v in info.supported_versions if v in KUBELET_DRA_SERVICES), None)
            if info.type != "DRAPlugin" or info.name != driver or chosen is None:
                await reg.NotifyRegistrationStatus(rp.RegistrationStatus(
                    plugin_registered=False,
                    error=f"rejected: type={info.type} versions={list(info.supported_versions)}"),
                    timeout=5)
                raise RuntimeError(f"registration rejected: {info}")
            await reg.NotifyRegistrationStatus(rp.RegistrationStatus(plugin_registered=True), timeout=5)
        return DraConnection(info, chosen)

    async def kubelet_dra_services(self) -> tuple[str, ...]:
        return KUBELET_DRA_SERVICES


class DraConnection:
    """The stand-in's connection to one DRA plugin endpoint, speaking the negotiated version."""

    def __init__(self, info: rp.PluginInfo, version: str) -> None:
        self.info = info
        self.version = version
        self.supported = list(info.supported_versions)
        self.channel = grpc.aio.insecure_channel(f"unix://{info.endpoint}")
        self._v1 = d1_grpc.DRAPluginStub(self.channel)
        self._v1beta1 = d1b_grpc.DRAPluginStub(self.channel)
        self.health = hp_grpc.DRAResourceHealthStub(self.channel)

    async def close(self) -> None:
        await self.channel.close(None)

    async def prepare(self, *claims: tuple[str, str, str], version: str | None = None) -> dict[str, object]:
        """Prepare claims given as (namespace, uid, name); returns the per-claim responses keyed by UID."""
        if (version or self.version) == "v1.DRAPlugin":
            r1 = await self._v1.NodePrepareResources(d1.NodePrepareResourcesRequest(
                claims=[d1.Claim(namespace=n, uid=u, name=m) for n, u, m in claims]), timeout=45)
            return dict(r1.claims)
        rb = await self._v1beta1.NodePrepareResources(d1b.NodePrepareResourcesRequest(
            claims=[d1b.Claim(namespace=n, uid=u, name=m) for n, u, m in claims]), timeout=45)
        return dict(rb.claims)

    async def unprepare(self, *claims: tuple[str, str, str], version: str | None = None) -> dict[str, object]:
        if (version or self.version) == "v1.DRAPlugin":
            r1 = await self._v1.NodeUnprepareResources(d1.NodeUnprepareResourcesRequest(
                claims=[d1.Claim(namespace=n, uid=u, name=m) for n, u, m in claims]), timeout=45)
            return dict(r1.claims)
        rb = await self._v1beta1.NodeUnprepareResources(d1b.NodeUnprepareResourcesRequest(
            claims=[d1b.Claim(namespace=n, uid=u, name=m) for n, u, m in claims]), timeout=45)
        return dict(rb.claims)

    def watch_health(self) -> Any:
        return self.health.NodeWatchResources(hp.NodeWatchResourcesRequest())


def socket_files(directory: Path) -> list[str]:
    """Names of the unix sockets in a directory (for assertions)."""
    out = []
    for entry in os.scandir(directory):
        with contextlib.suppress(OSError):
            if stat.S_ISSOCK(entry.stat().st_mode):
                out.append(entry.name)
    return sorted(out)
