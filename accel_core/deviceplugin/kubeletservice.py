"""The kubelet's device-plugin gRPC service (``v1beta1.DevicePlugin``) over a
:class:`accel_core.deviceplugin.pluginserver.DevicePluginServer`: messages in and out, bounds and policy calls
left to the server."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Sequence
from typing import Protocol

import grpc

from accel_core.deviceplugin.policy import AdvertisedDevice, AllocationError, DevicePluginPolicy
from accel_core.deviceplugin.servermetrics import DevicePluginMetrics
from accel_core.edits import ContainerEdits
from accel_core.grpc_types import Ctx
from accel_core.kubeletapi import deviceplugin_v1beta1_pb2 as pb
from accel_core.kubeletapi import deviceplugin_v1beta1_pb2_grpc as pb_grpc
from accel_core.logs import kv

log = logging.getLogger(__name__)


class ServedResource(Protocol):
    """What the service asks of the server behind it."""

    resource_name: str

    @property
    def metrics(self) -> DevicePluginMetrics: ...

    def device_updates(self) -> AsyncIterator[list[AdvertisedDevice]]: ...

    async def loaded_policy(self, context: Ctx) -> DevicePluginPolicy: ...

    def bounded_ids(self, where: str, field: str, ids: Sequence[str], *, drop_unknown: bool = False) -> list[str]: ...

    def bounded_preferred_request(
        self, index: int, creq: pb.ContainerPreferredAllocationRequest
    ) -> tuple[list[str], list[str], int]: ...

    def check_and_allocate(self, ids: Sequence[str]) -> ContainerEdits: ...


def edits_to_response(edits: ContainerEdits) -> pb.ContainerAllocateResponse:
    """Translate generic container edits into the kubelet's per-container allocate response."""
    resp = pb.ContainerAllocateResponse()
    for node in edits.device_nodes:
        resp.devices.append(pb.DeviceSpec(container_path=node.path, host_path=node.host_path or node.path,
                                          permissions=node.permissions))
    for mount in edits.mounts:
        resp.mounts.append(pb.Mount(container_path=mount.container_path, host_path=mount.host_path,
                                    read_only=mount.read_only))
    resp.envs.update(dict(edits.env))
    resp.annotations.update(dict(edits.annotations))
    return resp


def _to_pb_device(dev: AdvertisedDevice) -> pb.Device:
    out = pb.Device(ID=dev.id, health="Healthy" if dev.healthy else "Unhealthy")
    if dev.numa_node is not None and dev.numa_node >= 0:
        out.topology.nodes.append(pb.NUMANode(ID=dev.numa_node))
    return out


class DevicePluginGrpc(pb_grpc.DevicePluginServicer):
    """The kubelet's DevicePlugin service (v1beta1) over one server: the wire side only."""

    def __init__(self, owner: ServedResource) -> None:
        self._owner = owner

    async def GetDevicePluginOptions(self, request: pb.Empty, context: Ctx) -> pb.DevicePluginOptions:  # noqa: N802
        return pb.DevicePluginOptions(pre_start_required=False, get_preferred_allocation_available=True)

    async def ListAndWatch(self, request: pb.Empty, context: Ctx) -> AsyncIterator[pb.ListAndWatchResponse]:  # noqa: N802
        async for devices in self._owner.device_updates():
            yield pb.ListAndWatchResponse(devices=[_to_pb_device(d) for d in devices])

    async def GetPreferredAllocation(  # noqa: N802
        self, request: pb.PreferredAllocationRequest, context: Ctx
    ) -> pb.PreferredAllocationResponse:
        out = pb.PreferredAllocationResponse()
        policy = await self._owner.loaded_policy(context)
        for index, creq in enumerate(request.container_requests):
            if index:
                await asyncio.sleep(0)  # each container is bounded by the node; let other calls run between them
            try:
                available, must, size = self._owner.bounded_preferred_request(index, creq)
                ids = policy.preferred(available, must, size)
            except AllocationError as exc:
                log.warning("preferred allocation refused", extra=kv(resource=self._owner.resource_name, error=exc))
                await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
            out.container_responses.append(pb.ContainerPreferredAllocationResponse(deviceIDs=ids))
        return out

    async def Allocate(self, request: pb.AllocateRequest, context: Ctx) -> pb.AllocateResponse:  # noqa: N802
        owner = self._owner
        resource = owner.resource_name
        await owner.loaded_policy(context)
        start = time.perf_counter()
        out = pb.AllocateResponse()
        for index, creq in enumerate(request.container_requests):
            if index:
                await asyncio.sleep(0)
            try:
                ids = owner.bounded_ids(f"Allocate container request {index}", "devices_ids", creq.devices_ids)
                edits = owner.check_and_allocate(ids)
            except AllocationError as exc:
                owner.metrics.allocations.labels(resource, "error").inc()
                log.warning("allocate refused", extra=kv(resource=resource, error=exc))
                await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
            owner.metrics.allocations.labels(resource, "ok").inc()
            out.container_responses.append(edits_to_response(edits))
        owner.metrics.allocate_seconds.labels(resource).observe(time.perf_counter() - start)
        return out

    async def PreStartContainer(  # noqa: N802
        self, request: pb.PreStartContainerRequest, context: Ctx
    ) -> pb.PreStartContainerResponse:
        return pb.PreStartContainerResponse()
