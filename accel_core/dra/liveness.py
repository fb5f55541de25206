"""The liveness probe endpoint: the standard gRPC health service (``grpc.health.v1.Health/Check``) on TCP.

The chart probes service ``liveness``; it answers SERVING only when the driver's own kubelet-facing sockets work:
``GetInfo`` on the registration socket and an empty ``NodePrepareResources`` on the DRA socket (the same check
the upstream DRA helper makes). The empty service name ``""`` reports the server itself.

The messages and the servicer base come from grpcio-health-checking (the gRPC project's own generated
``grpc.health.v1`` code); only ``Check`` is served, and it answers from a live check rather than a stored status.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from accel_core.kubeletapi import dra_v1_pb2 as d1
from accel_core.kubeletapi import dra_v1_pb2_grpc as d1_grpc
from accel_core.kubeletapi import pluginregistration_v1_pb2 as rp
from accel_core.kubeletapi import pluginregistration_v1_pb2_grpc as rp_grpc
from accel_core.logs import kv

log = logging.getLogger(__name__)

LIVENESS = "liveness"
HealthCheckRequest = health_pb2.HealthCheckRequest
HealthCheckResponse = health_pb2.HealthCheckResponse
SERVING = HealthCheckResponse.SERVING
NOT_SERVING = HealthCheckResponse.NOT_SERVING


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
        health_pb2_grpc.add_HealthServicer_to_server(_Health(self._check), server)
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



class _Health(health_pb2_grpc.HealthServicer):  # type: ignore[misc]
    """``Check`` only; ``Watch`` and ``List`` stay unimplemented (the probe does not use them)."""

    def __init__(self, check: Callable[[], Awaitable[str | None]]) -> None:
        self._check = check

    async def Check(self, request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:  # noqa: N802
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
