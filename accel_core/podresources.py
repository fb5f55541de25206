"""The kubelet's PodResources v1 ``List``: which device IDs of which resources pods hold.

One client for every daemon: :class:`PodResourcesClient` keeps one channel to
``<kubelet-root>/pod-resources/kubelet.sock`` (re-opened after a failure, so a restarted kubelet is found again)
and answers with the IDs in use per resource. It is blocking and thread-safe: the metrics scrape thread calls it
directly, asyncio code through :meth:`PodResourcesClient.in_use_async` (a worker thread; the loop never waits).
"""

from __future__ import annotations

import asyncio
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
                code = exc.code().name if isinstance(exc, grpc.Call) else "UNKNOWN"
                details = exc.details() if isinstance(exc, grpc.Call) else str(exc)
                raise PodResourcesUnavailable(f"PodResources List failed ({code}: {details})") from None
        return resp

    def in_use(self, resources: Iterable[str]) -> dict[str, set[str]]:
        """Resource -> IDs pods hold now (blocking)."""
        return devices_in_use(self.list(), resources)

    async def list_async(self) -> pr.ListPodResourcesResponse:
        """:meth:`list` in a worker thread."""
        return await asyncio.to_thread(self.list)

    async def in_use_async(self, resources: Iterable[str]) -> dict[str, set[str]]:
        """:meth:`in_use` for asyncio callers."""
        return devices_in_use(await self.list_async(), resources)

    def close(self) -> None:
        with self._lock:
            self._close_locked()

    def _close_locked(self) -> None:
        if self._channel is not None:
            self._channel.close()
        self._channel = self._stub = None
