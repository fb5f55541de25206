"""A generic kubelet device-plugin server (v1beta1) over a unix socket.

Life cycle, as the kubelet requires it:
- serve DevicePlugin on ``<device-plugins dir>/<socket>``, then Register with ``kubelet.sock`` (the kubelet dials
  back and calls GetDevicePluginOptions during Register);
- ListAndWatch sends the full list at once and again on every change (both ways: Unhealthy and back);
- a re-created ``kubelet.sock`` means the kubelet restarted and deleted every socket there, ours included: serve
  again and register again (inotify makes this sub-second);
- our own socket deleted: serve again and register again;
- no kubelet: keep serving and retry; never exit for it; nothing to advertise yet: do not register at all.

A daemon may also start a server before its driver is loaded (``policy=None`` plus a cheap ``expect_devices``
probe, then :meth:`DevicePluginServer.attach`): it serves and registers first, as fast as a no-op plugin, and
ListAndWatch sends the first list once the policy is attached and has read the host. prometheus_client and the
watcher are loaded only then, so they cost nothing before the kubelet knows the plugin.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import os
from collections.abc import AsyncIterator, Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import grpc

from accel_core.deviceplugin.kubeletservice import DevicePluginGrpc
from accel_core.deviceplugin.policy import AdvertisedDevice, AllocationError, DevicePluginPolicy
from accel_core.deviceplugin.servermetrics import DevicePluginMetrics, metrics_for
from accel_core.edits import ContainerEdits
from accel_core.grpc_types import Ctx
from accel_core.instancelock import InstanceConflict, InstanceLock, LockPathError
from accel_core.kubeletapi import deviceplugin_v1beta1_pb2 as pb
from accel_core.kubeletapi import deviceplugin_v1beta1_pb2_grpc as pb_grpc
from accel_core.logs import kv
from accel_core.paths import HostPaths, check_socket_path

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry

    from accel_core.watch import ChangeWatcher

log = logging.getLogger(__name__)

API_VERSION = "v1beta1"
REGISTER_TIMEOUT_S = 5.0
#: the largest request the plugin socket reads: a kubelet call names at most a node's devices (IDs of at most 63
#: characters), a few KB; gRPC's default of 4 MB let one call carry a million IDs
MAX_REQUEST_BYTES = 256 * 1024
#: how much of a bad ID an error message quotes
MAX_ID_IN_ERROR = 64
#: the directory watch's safety re-arm (inotify wakes it at once; this only covers a lost watch)
RE_ARM_S = 30.0


def _identity(path: Path) -> tuple[int, int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_ino, st.st_ctime_ns)


def _nothing_held(_resource: str) -> frozenset[str]:
    return frozenset()


class DevicePluginServer:
    """Serves one extended resource for one policy until ``stop`` is set."""

    def __init__(
        self,
        policy: DevicePluginPolicy | None,
        paths: HostPaths,
        *,
        registry: CollectorRegistry | None = None,
        retry_interval: float = 1.0,
        resource_name: str | None = None,
        socket_name: str | None = None,
        expect_devices: Callable[[], bool] | None = None,
    ) -> None:
        """``policy=None`` starts without a driver: give ``resource_name``, ``socket_name`` and ``expect_devices``
        (a cheap probe: register only when it says devices are there), then :meth:`attach` the policy."""
        self.policy = policy
        self.resource_name = resource_name or (policy.resource_name if policy is not None else "")
        socket_name = socket_name or (policy.socket_name if policy is not None else "")
        if not self.resource_name or not socket_name:
            raise ValueError("a server without a policy needs resource_name and socket_name")
        self._expect = expect_devices or (lambda: False)
        self._registry = registry
        self._metrics: DevicePluginMetrics | None = metrics_for(registry) if policy is not None else None
        self._registrations = 0  # Register calls made before the metrics existed
        self._listed = False
        self._task: asyncio.Task[None] | None = None
        #: set once the first serve-and-register attempt is over (registered or not)
        self.first_round = asyncio.Event()
        self._loaded = asyncio.Event()
        if policy is not None:
            self._loaded.set()
        self._dir = paths.device_plugins_dir
        self._socket = self._dir / socket_name
        self._lock = InstanceLock.for_device_plugin(self._dir, socket_name)
        self._kubelet_sock = paths.kubelet_socket
        self._retry = retry_interval
        self._devices: list[AdvertisedDevice] = []
        self._by_id: dict[str, AdvertisedDevice] = {}
        self._version = 0
        self._cond = asyncio.Condition()
        self._server: grpc.aio.Server | None = None
        self._socket_id: tuple[int, int] | None = None
        self._registered_with: tuple[int, int] | None = None
        self._watcher: ChangeWatcher | None = None
        self._last_problem = ""
        self.registered = asyncio.Event()
        #: IDs of a resource that pods hold through the DRA driver of the same hardware (advertised Unhealthy); set
        #: by the runner from its :class:`~accel_core.deviceplugin.handover.DraHandover`
        self.held: Callable[[str], frozenset[str]] = _nothing_held

    @property
    def socket_path(self) -> Path:
        return self._socket

    @property
    def metrics(self) -> DevicePluginMetrics:
        if self._metrics is None:
            self._metrics = metrics_for(self._registry)
            self._metrics.registered.labels(self.resource_name).set(1 if self.registered.is_set() else 0)
            if self._registrations:
                self._metrics.registrations.labels(self.resource_name).inc(self._registrations)
        return self._metrics

    async def attach(self, policy: DevicePluginPolicy, registry: CollectorRegistry | None = None) -> None:
        """Give a server started without a policy its driver (and its metrics registry), read the first device
        list and send it."""
        if policy.resource_name != self.resource_name:
            raise ValueError(f"policy for {policy.resource_name} attached to the {self.resource_name} server")
        if self._metrics is None and registry is not None:
            self._registry = registry
        self.policy = policy
        self._loaded.set()
        await self.refresh()
        if self._watcher is not None:
            self._watcher.kick("attached")

    async def loaded_policy(self, context: Ctx) -> DevicePluginPolicy:
        """The policy, once attached; a call that arrives before (the kubelet never sends one: it allocates only
        listed IDs) is refused as UNAVAILABLE after a short wait."""
        if self.policy is None:
            try:
                await asyncio.wait_for(self._loaded.wait(), REGISTER_TIMEOUT_S)
            except TimeoutError:
                await context.abort(grpc.StatusCode.UNAVAILABLE, f"{self.resource_name}: the device list is not "
                                    "read yet; retry")
        assert self.policy is not None
        return self.policy

    @property
    def devices(self) -> list[AdvertisedDevice]:
        return list(self._devices)

    # -- device list ---------------------------------------------------------------------------------------------
    async def refresh(self) -> bool:
        """Re-read the policy's device list; wake ListAndWatch streams if it changed (or is the first). Returns True
        on change."""
        if self.policy is None:
            return False
        try:
            blocked = self.policy.advertise_blocked()
            devices = [] if blocked else list(self.policy.devices())
            held = self.held(self.resource_name) if devices else frozenset()
            if held:  # the same hardware is in a DRA claim's hands: not allocatable until its pod ends
                devices = [dataclasses.replace(d, healthy=False) if d.id in held else d for d in devices]
        except Exception:  # a policy bug must not take the daemon down: keep the last good list
            log.exception("reading the device list failed; keeping the previous one",
                          extra=kv(resource=self.policy.resource_name))
            return False
        if blocked:
            self._note(f"advertising nothing: {blocked}")
        if devices == self._devices and self._listed:
            return False
        self._listed = True
        async with self._cond:
            self._devices = devices
            self._by_id = {d.id: d for d in devices}
            self._version += 1
            self._cond.notify_all()
        healthy = sum(d.healthy for d in devices)
        resource = self.resource_name
        self.metrics.devices.labels(resource, "healthy").set(healthy)
        self.metrics.devices.labels(resource, "unhealthy").set(len(devices) - healthy)
        log.info("device list changed", extra=kv(resource=resource, devices=len(devices), healthy=healthy))
        if self._watcher is not None:
            self._watcher.kick("devices")
        return True

    async def device_updates(self) -> AsyncIterator[list[AdvertisedDevice]]:
        """The current list once the first one is read, then the full list after every change (for one ListAndWatch
        stream)."""
        seen = [0]
        while True:
            async with self._cond:
                await self._cond.wait_for(lambda: self._version != seen[0])
                seen[0] = self._version
                snapshot = list(self._devices)
            yield snapshot

    def bounded_ids(self, where: str, field: str, ids: Sequence[str], *, drop_unknown: bool = False) -> list[str]:
        """``ids`` if the node could have sent them: no more than the advertised devices (checked before reading
        them), each one advertised (or, with ``drop_unknown``, the advertised ones only); else AllocationError
        naming the request and the first bad ID."""
        limit = len(self._by_id)
        if len(ids) > limit:
            raise AllocationError(f"{where}: {len(ids)} {field} for {self.resource_name}, more than the {limit} "
                                  "devices this node advertises")
        if drop_unknown:
            return [device_id for device_id in ids if device_id in self._by_id]
        for device_id in ids:
            if device_id not in self._by_id:
                raise AllocationError(f"{where}: unknown device ID {device_id[:MAX_ID_IN_ERROR]!r} in {field} for "
                                      f"{self.resource_name}")
        return list(ids)

    def bounded_preferred_request(
        self, index: int, creq: pb.ContainerPreferredAllocationRequest
    ) -> tuple[list[str], list[str], int]:
        """(available, must_include, size) of one container's preferred-allocation request, each bounded by the
        devices this node advertises (AllocationError naming the request otherwise): the policy's work is then
        bounded by the node, whatever the caller sent."""
        where = f"GetPreferredAllocation container request {index}"
        size = int(creq.allocation_size)
        limit = len(self._by_id)
        if not 0 <= size <= limit:
            raise AllocationError(f"{where}: allocation_size {size} for {self.resource_name} is not within the "
                                  f"{limit} devices this node advertises")
        # an ID the list no longer has (changed since the kubelet read it) is not offered; a must-include one is an
        # error: the answer must hold it, and it is not ours to hand out
        available = self.bounded_ids(where, "available_deviceIDs", creq.available_deviceIDs, drop_unknown=True)
        must = self.bounded_ids(where, "must_include_deviceIDs", creq.must_include_deviceIDs)
        return available, must, size

    def check_and_allocate(self, ids: Sequence[str]) -> ContainerEdits:
        """Validate IDs against the advertised list (unknown or unhealthy -> AllocationError), then allocate."""
        by_id = self._by_id
        for device_id in ids:
            dev = by_id.get(device_id)
            if dev is None:
                raise AllocationError(f"unknown device ID {device_id!r} for {self.resource_name}")
            if not dev.healthy:
                raise AllocationError(f"device {device_id!r} of {self.resource_name} is unhealthy")
        assert self.policy is not None  # devices are listed only once it is attached
        return self.policy.allocate(ids)

    # -- life cycle ----------------------------------------------------------------------------------------------
    def start(self, stop: asyncio.Event) -> asyncio.Task[None]:
        """:meth:`run` as a task, started once (later calls return the same task)."""
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self.run(stop))
        return self._task

    async def run(self, stop: asyncio.Event) -> None:
        """Serve, register and keep both alive until ``stop`` is set; then remove the socket."""
        try:
            await self.refresh()
            if stop.is_set():  # stopped while starting: serve nothing
                return
            await self._reconcile_logged()  # serve and register before the watcher is even loaded
            self.first_round.set()
            from accel_core.watch import ChangeWatcher

            # events on the directory (kubelet.sock re-created, our socket deleted) wake us at once; until
            # registered a retry tick re-checks (a few stats) as well; the watch is re-armed on events and every
            # RE_ARM_S
            watcher = ChangeWatcher(lambda: [self._dir], rescan_interval=max(RE_ARM_S, self._retry),
                                    debounce=0.01, depth=0)
            self._watcher = watcher
            async with watcher:  # its first wake-up ("armed") re-checks what changed before the watch existed
                async for _ in watcher.changes(stop):
                    await self._reconcile_logged()
                    watcher.poll_interval = None if self.registered.is_set() else self._retry
        finally:
            self.first_round.set()
            self._watcher = None
            await self._stop_server()
            self._lock.release()
            log.info("device plugin stopped", extra=kv(resource=self.resource_name))

    async def _reconcile_logged(self) -> None:
        try:
            await self._reconcile()
        except (InstanceConflict, LockPathError):
            raise  # another process serves this socket, or the lock path is unusable: stop, never delete the socket
        except Exception:  # a daemon never dies for one bad round; the next wake-up retries
            log.exception("device plugin reconcile failed; retrying", extra=kv(resource=self.resource_name))
            await self._stop_server()

    async def _reconcile(self) -> None:
        if self.policy is None:
            want = self._server is not None or self._expect()
        else:
            want = bool(self._devices) or self._server is not None
        if not want:
            self._note("no devices to advertise; not registering, still watching")
            return
        if not self._dir.is_dir():
            self._note(f"kubelet device-plugin directory {self._dir} does not exist; waiting for it")
            return
        self._lock.acquire()  # before serving removes a socket of our name (InstanceConflict if another has it)
        if self._server is None or _identity(self._socket) != self._socket_id:
            if self._server is not None:
                log.warning("plugin socket vanished (kubelet restart?); serving again",
                            extra=kv(socket=str(self._socket)))
            await self._start_server()
        kubelet_id = _identity(self._kubelet_sock)
        if kubelet_id is None:
            if self._registered_with is not None:
                log.warning("kubelet socket gone; waiting for the kubelet", extra=kv(socket=str(self._kubelet_sock)))
            self._mark_unregistered()
            self._note(f"kubelet socket {self._kubelet_sock} not present; waiting for the kubelet")
            return
        if kubelet_id != self._registered_with:
            await self._register(kubelet_id)

    async def _start_server(self) -> None:
        await self._stop_server()
        self._mark_unregistered()
        with contextlib.suppress(FileNotFoundError):
            self._socket.unlink()
        server = grpc.aio.server(options=[("grpc.max_receive_message_length", MAX_REQUEST_BYTES)])
        pb_grpc.add_DevicePluginServicer_to_server(DevicePluginGrpc(self), server)
        try:
            check_socket_path(self._socket)
            server.add_insecure_port(f"unix://{self._socket}")
            await server.start()
        except Exception as exc:
            self._note(f"cannot serve on {self._socket}: {exc}")
            with contextlib.suppress(Exception):
                await server.stop(None)
            return
        self._server = server
        # A started server listens on the socket it bound: no round trip to ourselves before Register (a fresh
        # channel costs ~15 ms of start-up). If the socket is gone or replaced later, its identity differs and the
        # next reconcile serves again; if the kubelet cannot reach us, Register fails and is retried.
        self._socket_id = _identity(self._socket)
        if self._socket_id is None:
            self._note(f"own socket {self._socket} vanished right after serving; serving again later")
            await self._stop_server()
            return
        log.info("serving device plugin", extra=kv(resource=self.resource_name, socket=str(self._socket)))

    async def _stop_server(self) -> None:
        server, self._server = self._server, None
        if server is None:
            return
        await server.stop(grace=0.2)
        if self._socket_id is not None and _identity(self._socket) == self._socket_id:
            with contextlib.suppress(FileNotFoundError):
                self._socket.unlink()
        self._socket_id = None
        self._mark_unregistered()

    async def _register(self, kubelet_id: tuple[int, int]) -> None:
        resource = self.resource_name
        request = pb.RegisterRequest(
            version=API_VERSION,
            endpoint=self._socket.name,
            resource_name=resource,
            options=pb.DevicePluginOptions(pre_start_required=False, get_preferred_allocation_available=True),
        )
        try:
            async with grpc.aio.insecure_channel(f"unix://{self._kubelet_sock}") as channel:
                await pb_grpc.RegistrationStub(channel).Register(request, timeout=REGISTER_TIMEOUT_S)
        except grpc.aio.AioRpcError as exc:
            self._note(f"register with kubelet failed ({exc.code().name}: {exc.details()}); retrying")
            return
        self._registered_with = kubelet_id
        self._last_problem = ""
        self.registered.set()
        if self._metrics is None:
            self._registrations += 1  # counted when the metrics are loaded (see metrics)
        else:
            self._metrics.registrations.labels(resource).inc()
            self._metrics.registered.labels(resource).set(1)
        log.info("registered with kubelet", extra=kv(resource=resource, endpoint=self._socket.name,
                                                     devices=len(self._devices)))

    def _mark_unregistered(self) -> None:
        self._registered_with = None
        self.registered.clear()
        if self._metrics is not None:
            self._metrics.registered.labels(self.resource_name).set(0)

    def _note(self, problem: str) -> None:
        """Log a waiting condition once, not on every retry."""
        if problem != self._last_problem:
            log.info(problem, extra=kv(resource=self.resource_name))
            self._last_problem = problem


async def register_first(servers: Sequence[DevicePluginServer], stop: asyncio.Event) -> None:
    """Start ``servers`` and return once each has served and registered (or decided not to, or given up for now):
    the caller loads its driver after this, while the kubelet already knows the plugin."""
    for server in servers:
        server.start(stop)

    async def rounds() -> None:
        for server in servers:
            await server.first_round.wait()

    done, stopping = asyncio.ensure_future(rounds()), asyncio.ensure_future(stop.wait())
    try:
        await asyncio.wait({done, stopping}, timeout=2 * REGISTER_TIMEOUT_S, return_when=asyncio.FIRST_COMPLETED)
    finally:
        done.cancel()
        stopping.cancel()
    tasks = [server.start(stop) for server in servers]
    failed = [t for t in tasks if t.done() and not t.cancelled() and t.exception() is not None]
    if failed:  # e.g. another instance serves our socket: stop the others, do not load the driver
        stop.set()
        await asyncio.gather(*tasks, return_exceptions=True)
        raise failed[0].exception()  # type: ignore[misc]
