"""The Python floor of the device-plugin benchmarks: a device plugin that does nothing beyond the protocol.

It imports only grpc and the generated v1beta1 messages, serves DevicePlugin on ``--socket``, registers
``--resource`` with the kubelet at ``--kubelet``, lists ``--devices`` healthy devices once, answers Allocate with
empty container responses and GetPreferredAllocation with the first available IDs. What a real daemon costs above
this process is its own work; this process's cost is what Python and grpcio cost.

    python bench/peers/floor_plugin.py --socket DIR/floor.sock --kubelet DIR/kubelet.sock
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc

from accel_core.kubeletapi import deviceplugin_v1beta1_pb2 as pb
from accel_core.kubeletapi import deviceplugin_v1beta1_pb2_grpc as pb_grpc


class Floor(pb_grpc.DevicePluginServicer):
    def __init__(self, count: int) -> None:
        self.devices = [pb.Device(ID=f"dev-{i}", health="Healthy") for i in range(count)]
        self.stop = asyncio.Event()

    async def GetDevicePluginOptions(self, request: pb.Empty, context: Any) -> pb.DevicePluginOptions:  # noqa: N802
        return pb.DevicePluginOptions(get_preferred_allocation_available=True)

    async def ListAndWatch(self, request: pb.Empty, context: Any) -> AsyncIterator[pb.ListAndWatchResponse]:  # noqa: N802
        yield pb.ListAndWatchResponse(devices=self.devices)
        await self.stop.wait()

    async def GetPreferredAllocation(self, request: pb.PreferredAllocationRequest,  # noqa: N802
                                     context: Any) -> pb.PreferredAllocationResponse:
        return pb.PreferredAllocationResponse(container_responses=[
            pb.ContainerPreferredAllocationResponse(deviceIDs=list(c.available_deviceIDs)[:c.allocation_size])
            for c in request.container_requests])

    async def Allocate(self, request: pb.AllocateRequest, context: Any) -> pb.AllocateResponse:  # noqa: N802
        return pb.AllocateResponse(container_responses=[pb.ContainerAllocateResponse()
                                                        for _ in request.container_requests])


async def serve(args: argparse.Namespace) -> None:
    floor = Floor(args.devices)
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, floor.stop.set)
    socket = Path(args.socket)
    if socket.exists():
        os.unlink(socket)
    server = grpc.aio.server()
    pb_grpc.add_DevicePluginServicer_to_server(floor, server)
    server.add_insecure_port(f"unix://{socket}")
    await server.start()
    async with grpc.aio.insecure_channel(f"unix://{args.kubelet}") as channel:
        await pb_grpc.RegistrationStub(channel).Register(pb.RegisterRequest(
            version="v1beta1", endpoint=socket.name, resource_name=args.resource,
            options=pb.DevicePluginOptions(get_preferred_allocation_available=True)), timeout=10)
    await floor.stop.wait()
    await server.stop(0.1)


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--socket", required=True)
    parser.add_argument("--kubelet", required=True)
    parser.add_argument("--resource", default="example.com/floor")
    parser.add_argument("--devices", type=int, default=16)
    asyncio.run(serve(parser.parse_args()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
