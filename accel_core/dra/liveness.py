"""The liveness probe endpoint: the standard gRPC health service (``grpc.health.v1.Health/Check``) on TCP.

The chart probes service ``liveness``; it answers SERVING only when the driver's own kubelet-facing sockets work:
``GetInfo`` on the registration socket and an empty ``NodePrepareResources`` on the DRA socket (the same check
the upstream DRA helper makes). The empty service name ``""`` reports the server itself.

The two health messages are built at import time from a descriptor in a private pool, so no generated code or
extra package (grpcio-health-checking) is needed and nothing clashes with a generated copy elsewhere.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any

import grpc
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

from accel_core.kubeletapi import dra_v1_pb2 as d1
from accel_core.kubeletapi import dra_v1_pb2_grpc as d1_grpc
from accel_core.kubeletapi import pluginregistration_v1_pb2 as rp
from accel_core.kubeletapi import pluginregistration_v1_pb2_grpc as rp_grpc
from accel_core.logs import kv

log = logging.getLogger(__name__)

SERVICE = "grpc.health.v1.Health"
LIVENESS = "liveness"
UNKNOWN, SERVING, NOT_SERVING, SERVICE_UNKNOWN = 0, 1, 2, 3


def _health_messages() -> tuple[Any, Any]:
    fdp = descriptor_pb2.FileDescriptorProto(name="accel_core/grpc_health_v1.proto", package="grpc.health.v1",
                                             syntax="proto3")
    req = fdp.message_type.add(name="HealthCheckRequest")
    req.field.add(name="service", number=1, type=descriptor_pb2.FieldDescriptorProto.TYPE_STRING,
                  label=descriptor_pb2.FieldDescriptorProto.LABEL_OPTIONAL)
    resp = fdp.message_type.add(name="HealthCheckResponse")
    enum = resp.enum_type.add(name="ServingStatus")
    for name, number in (("UNKNOWN", UNKNOWN), ("SERVING", SERVING), ("NOT_SERVING", NOT_SERVING),
                         ("SERVICE_UNKNOWN", SERVICE_UNKNOWN)):
        enum.value.add(name=name, number=number)
    resp.field.add(name="status", number=1, type=descriptor_pb2.FieldDescriptorProto.TYPE_ENUM,
                   label=descriptor_pb2.FieldDescriptorProto.LABEL_OPTIONAL,
                   type_name=".grpc.health.v1.HealthCheckResponse.ServingStatus")
    pool = descriptor_pool.DescriptorPool()
    pool.Add(fdp)
    return (message_factory.GetMessageClass(pool.FindMessageTypeByName("grpc.health.v1.HealthCheckRequest")),
            message_factory.GetMessageClass(pool.FindMessageTypeByName("grpc.health.v1.HealthCheckResponse")))


HealthCheckRequest, HealthCheckResponse = _health_messages()


async def check_own_sockets(registration_socket: str, dra_socket: str, timeout: float = 3.0) -> str | None:
    """None when both sockets answer; otherwise what failed."""
    try:
        async with grpc.aio.insecure_channel(f"unix://{registration_socket}") as channel:
            await rp_grpc.RegistrationStub(channel).GetInfo(rp.InfoRequest(), timeout=timeout)
    except grpc.aio.AioRpcError as exc:
        return f"registration socket {registration_socket}: {exc.code().name}: {exc.details()}"
    try:
        async with grpc.aio.insecure_channel(f"unix://{dra_socket}") as channel:
            await d1_grpc.DRAPluginStub(channel).NodePrepareResources(d1.NodePrepareResourcesRequest(),
                                                                      timeout=timeout)
    except grpc.aio.AioRpcError as exc:
        return f"DRA socket {dra_socket}: {exc.code().name}: {exc.details()}"
    return None


class LivenessServer:
    """Serves ``grpc.health.v1.Health/Check`` on ``address:port``; ``check()`` decides the ``liveness`` answer."""

    def __init__(self, check: Callable[[], Awaitable[str | None]], port: int, address: str = "[::]") -> None:
        self._check = check
        self._port = port
        self._address = address
        self._server: grpc.aio.Server | None = None
        self.port: int | None = None

    async def start(self) -> None:
        server = grpc.aio.server()
        handler = grpc.method_handlers_generic_handler(SERVICE, {
            "Check": grpc.unary_unary_rpc_method_handler(
                self._handle_check, request_deserializer=HealthCheckRequest.FromString,
                response_serializer=HealthCheckResponse.SerializeToString),
        })
        server.add_generic_rpc_handlers((handler,))
        bound = 0
        for address in dict.fromkeys((self._address, "0.0.0.0")):
            try:
                bound = server.add_insecure_port(f"{address}:{self._port}")
            except RuntimeError:
                bound = 0
            if bound:
                break
        if not bound:
            log.error("liveness health port could not be bound; probes will fail", extra=kv(port=self._port))
            return
        await server.start()
        self._server = server
        self.port = bound
        log.info("liveness health service listening", extra=kv(port=bound, service=LIVENESS))

    async def stop(self) -> None:
        if self._server is not None:
            await self._server.stop(grace=0.2)
            self._server = None

    async def _handle_check(self, request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
        service = request.service
        if service == "":
            return HealthCheckResponse(status=SERVING)
        if service != LIVENESS:
            await context.abort(grpc.StatusCode.NOT_FOUND, f"unknown service {service!r}")
        problem = await self._check()
        if problem:
            log.warning("liveness check failed", extra=kv(problem=problem))
            return HealthCheckResponse(status=NOT_SERVING)
        return HealthCheckResponse(status=SERVING)
