"""The kubelet's PodResources v1 ``List``: which device IDs of which resources pods hold.

One client for every daemon: :class:`PodResourcesClient` keeps a channel to
``<kubelet-root>/pod-resources/kubelet.sock`` (re-opened after a failure, so a restarted kubelet is found again)
and answers with the IDs in use per resource: :meth:`~PodResourcesClient.in_use` blocks (for the metrics scrape
thread), :meth:`~PodResourcesClient.in_use_async` awaits on the event loop (for pollers). Each keeps its own
kept-open channel, since a blocking gRPC channel cannot serve asyncio callers and the other way round.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable
from pathlib import Path

import grpc

from accel_core.kubeletapi import podresources_v1_pb2 as pr
from accel_core.kubeletapi import podresources_v1_pb2_grpc as pr_grpc


class PodResourcesUnavailable(Exception):
    """The kubelet could not be asked (no socket, error, timeout); the message says which."""


def devices_in_use(response: pr.ListPodResourcesResponse, resources: Iterable[str]) -> dict[str, set[str]]:
    """Resource -> IDs held by any container (regular and init containers alike), for the given resources."""
    out: dict[str, set[str]] = {r: set() for r in resources}
    for pod in response.pod_resources:
        for container in pod.containers:
            for dev in container.devices:
                if dev.resource_name in out:
                    out[dev.resource_name].update(dev.device_ids)
    return out


def devices_by_pod(response: pr.ListPodResourcesResponse, resources: Iterable[str]) -> dict[str, dict[str, set[str]]]:
    """``namespace/name`` -> resource -> IDs its containers hold, for pods holding any of the given resources."""
    wanted = set(resources)
    out: dict[str, dict[str, set[str]]] = {}
    for pod in response.pod_resources:
        for container in pod.containers:
            for dev in container.devices:
                if dev.resource_name in wanted:
                    held = out.setdefault(f"{pod.namespace}/{pod.name}", {})
                    held.setdefault(dev.resource_name, set()).update(dev.device_ids)
    return out


class PodResourcesClient:
    """``List`` over one kept channel; :meth:`in_use` raises :class:`PodResourcesUnavailable` on any failure."""

    def __init__(self, socket: Path, timeout: float = 5.0) -> None:
        self.socket = socket
        self._timeout = timeout
        self._channel: grpc.Channel | None = None
        self._stub: pr_grpc.PodResourcesListerStub | None = None
        self._lock = threading.Lock()
        self._aio_channel: grpc.aio.Channel | None = None
        self._aio_stub: pr_grpc.PodResourcesListerStub | None = None

    def list(self) -> pr.ListPodResourcesResponse:
        """The kubelet's List answer (blocking, at most ``timeout`` seconds)."""
        if not self.socket.exists():
            self.close()
            raise PodResourcesUnavailable(f"PodResources socket {self.socket} not present")
        with self._lock:
            if self._stub is None:
                self._channel = grpc.insecure_channel(f"unix://{self.socket}")
                self._stub = pr_grpc.PodResourcesListerStub(self._channel)
            try:
                resp: pr.ListPodResourcesResponse = self._stub.List(pr.ListPodResourcesRequest(),
                                                                    timeout=self._timeout)
            except grpc.RpcError as exc:
                self._close_locked()
                raise _unavailable(exc) from None
        return resp

    def in_use(self, resources: Iterable[str]) -> dict[str, set[str]]:
        """Resource -> IDs pods hold now (blocking)."""
        return devices_in_use(self.list(), resources)

    async def list_async(self) -> pr.ListPodResourcesResponse:
        """:meth:`list` for asyncio callers (never blocks the loop)."""
        if not self.socket.exists():
            await self.aclose()
            raise PodResourcesUnavailable(f"PodResources socket {self.socket} not present")
        if self._aio_stub is None:
            self._aio_channel = grpc.aio.insecure_channel(f"unix://{self.socket}")
            self._aio_stub = pr_grpc.PodResourcesListerStub(self._aio_channel)
        try:
            resp: pr.ListPodResourcesResponse = await self._aio_stub.List(pr.ListPodResourcesRequest(),
                                                                          timeout=self._timeout)
        except grpc.aio.AioRpcError as exc:
            await self.aclose()
            raise _unavailable(exc) from None
        return resp

    async def in_use_async(self, resources: Iterable[str]) -> dict[str, set[str]]:
        """:meth:`in_use` for asyncio callers."""
        return devices_in_use(await self.list_async(), resources)

    def close(self) -> None:
        """Close the blocking channel (see :meth:`aclose` for the asyncio one)."""
        with self._lock:
            self._close_locked()

    async def aclose(self) -> None:
        channel, self._aio_channel, self._aio_stub = self._aio_channel, None, None
        if channel is not None:
            await channel.close(None)

    def _close_locked(self) -> None:
        if self._channel is not None:
            self._channel.close()
        self._channel = self._stub = None


def _unavailable(exc: grpc.RpcError) -> PodResourcesUnavailable:
    code = exc.code().name if isinstance(exc, grpc.Call) else "UNKNOWN"
    details = exc.details() if isinstance(exc, grpc.Call) else str(exc)
    return PodResourcesUnavailable(f"PodResources List failed ({code}: {details})")
