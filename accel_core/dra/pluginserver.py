"""A generic DRA kubelet plugin: registration socket, DRA v1 and v1beta1 services, and the v1alpha1 health stream.

- registration: ``<plugins_registry>/<driver>[-<podUID>]-reg.sock`` serves ``pluginregistration.Registration``;
  GetInfo says type ``DRAPlugin``, the driver name, the absolute DRA endpoint, and the supported services newest
  first (``v1.DRAPlugin``, ``v1beta1.DRAPlugin``, then ``v1alpha1.DRAResourceHealth`` when health is served);
- DRA: both versions on ``<plugins>/<driver>/dra[-<podUID>].sock``; every claim gets an entry in the response map;
  a claim failure goes in that claim's ``error`` (a lock file that cannot be opened, say on a read-only file
  system, too); calls are serialized (a thread lock, plus a file lock when a pod UID is set, so two pods of a
  rolling update never prepare at once); a call with no claims (the liveness probe's) takes no lock at all;
- health: every message is the complete list; a new message is sent whenever the driver says health changed. At
  most :data:`MAX_HEALTH_STREAMS` streams are open at once (the kubelet keeps one): a new one ends the oldest, so
  streams, which hold a server thread each, never take the threads prepares need.

The DRA socket is served by a synchronous gRPC server: each call runs in one of its threads, which does the whole
request there: the claims the handler names (:meth:`~accel_core.dra.types.DraHandler.claims_to_read`) are read
from the API server by the plugin's :class:`ClaimSource` (before the locks, so a slow API server holds up no other
request), then the locks are taken (waiting there, never on the event loop, while another pod holds the file lock)
and the handler gets the claim objects (``prepare_blocking``) or the references (``unprepare_blocking``). No hop
to the event loop and back (0.3-0.5 ms per prepare). Registration stays on an asyncio server; the event loop
keeps serving it, the liveness probe and the health stream's updates whatever the DRA calls are doing.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import itertools
import logging
import os
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import grpc
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from accel_core.backoff import Backoff
from accel_core.dra.kubeletservices import (
    DraV1beta1Service,
    DraV1Service,
    HealthService,
    RegistrationService,
    Results,
)
from accel_core.dra.logtext import Throttle, cut
from accel_core.dra.sockets import dra_socket_path, instance_lock_path, registration_socket_path, unlink_stale
from accel_core.dra.types import ClaimError, ClaimRef, DeviceHealthReport, DraHandler, PreparedDevice
from accel_core.instancelock import InstanceLock
from accel_core.kubeletapi import dra_health_v1alpha1_pb2_grpc as hp_grpc
from accel_core.kubeletapi import dra_v1_pb2_grpc as d1_grpc
from accel_core.kubeletapi import dra_v1beta1_pb2_grpc as d1b_grpc
from accel_core.kubeletapi import pluginregistration_v1_pb2_grpc as rp_grpc
from accel_core.kubeletapi.constants import (
    DRA_HEALTH_V1ALPHA1_SERVICE,
    DRA_V1_SERVICE,
    DRA_V1BETA1_SERVICE,
)
from accel_core.logs import kv
from accel_core.paths import HostPaths

if TYPE_CHECKING:
    from lightkube.resources.resource_v1 import ResourceClaim

log = logging.getLogger(__name__)

#: Threads of the DRA socket's server: each open health stream holds one; calls queue for the lock anyway.
DRA_SERVER_THREADS = 8
#: Health streams open at once, at most (the kubelet keeps one; a restarted kubelet's old one may linger): a new
#: stream ends the oldest, so at least DRA_SERVER_THREADS - MAX_HEALTH_STREAMS threads stay for calls.
MAX_HEALTH_STREAMS = 3
#: Registration answers kept for a reader (tests, diagnostics), newest last; older ones are dropped, so a kubelet
#: that keeps calling NotifyRegistrationStatus costs no memory (each error is kept cut, :func:`cut`).
REGISTRATION_STATUS_KEPT = 8

#: Claim UID -> its devices (prepare), None (unprepare), or its exception: a request's outcome before it is answered.
Outcomes = Mapping[str, Any]


class ClaimSource(Protocol):
    """Where the plugin reads claims (:class:`accel_core.dra.claims.ClaimReader`): blocking, in the calling
    thread."""

    def read_all(self, claims: Sequence[ClaimRef]) -> dict[str, ResourceClaim | None | BaseException]:
        """Each claim by UID: the API object, None when there is none, or the exception its read raised."""
        ...


class DraMetrics:
    """Prepare/unprepare counts, errors and latency; labelled by driver."""

    def __init__(self, registry: CollectorRegistry | None) -> None:
        reg = registry if registry is not None else CollectorRegistry()
        self.requests = Counter("accel_dra_claim_operations_total", "Claims prepared or unprepared, by result",
                                ["driver", "operation", "result"], registry=reg)
        self.seconds = Histogram("accel_dra_claim_operation_duration_seconds", "Per-claim prepare/unprepare latency",
                                 ["driver", "operation"], registry=reg,
                                 buckets=(0.001, 0.005, 0.01, 0.02, 0.05, 0.1, 0.5, 1, 5, 30))
        self.registered = Gauge("accel_dra_registered", "1 after the kubelet confirmed registration",
                                ["driver"], registry=reg)


def _stopping_error() -> ClaimError:
    return ClaimError("the driver is stopping; the kubelet retries the call")


class _Serial:
    """Prepares and unprepares one at a time: a thread lock (this process) and, with ``path``, an exclusive flock
    on that file (the other pod of a rolling update). Both wait with non-blocking tries, backing off up to 50 ms:
    :meth:`held` in the calling thread (a DRA server thread), :meth:`held_async` without blocking the event loop;
    once ``stopping`` is set a wait ends in ClaimError (the kubelet retries), so a stopping driver never hangs on
    the other pod's lock."""

    RETRY_MIN = 0.002
    RETRY_MAX = 0.05

    def __init__(self, path: Path | None, stopping: threading.Event) -> None:
        self._lock = threading.Lock()
        self._path = path
        self._stopping = stopping

    @contextlib.contextmanager
    def held(self) -> Iterator[None]:
        with self._lock:
            fd = self._open()
            try:
                backoff = Backoff(self.RETRY_MIN, self.RETRY_MAX)
                while not self._try_flock(fd):  # another pod is mid-prepare: wait in this thread
                    if self._stopping.wait(backoff.next()):
                        raise _stopping_error()
                yield
            finally:
                self._close(fd)

    @contextlib.asynccontextmanager
    async def held_async(self) -> AsyncIterator[None]:
        backoff = Backoff(self.RETRY_MIN, self.RETRY_MAX)
        while not self._lock.acquire(blocking=False):
            await self._wait(backoff)
        try:
            fd = self._open()
            try:
                backoff = Backoff(self.RETRY_MIN, self.RETRY_MAX)
                while not self._try_flock(fd):
                    await self._wait(backoff)
                yield
            finally:
                self._close(fd)
        finally:
            self._lock.release()

    async def _wait(self, backoff: Backoff) -> None:
        if self._stopping.is_set():
            raise _stopping_error()
        await asyncio.sleep(backoff.next())

    @staticmethod
    def _try_flock(fd: int | None) -> bool:
        """Take the flock without waiting; True when taken (or there is no file lock)."""
        if fd is None:
            return True
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        return True

    def _open(self) -> int | None:
        """The lock file, opened; ClaimError (for each claim of the call, not a failed RPC) when it cannot be."""
        if self._path is None:
            return None
        try:
            self._path.parent.mkdir(parents=True, exist_ok=True)
            return os.open(self._path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        except OSError as exc:
            raise ClaimError(f"cannot open lock file {self._path}: {exc.strerror or exc}") from exc

    @staticmethod
    def _close(fd: int | None) -> None:
        if fd is None:
            return
        try:
            fcntl.flock(fd, fcntl.LOCK_UN)
        finally:
            os.close(fd)


class DraPlugin:
    """Serves one DRA driver to the kubelet until stopped."""

    def __init__(
        self,
        handler: DraHandler,
        paths: HostPaths,
        *,
        claims: ClaimSource,
        pod_uid: str | None = None,
        serve_health: bool = True,
        registry: CollectorRegistry | None = None,
    ) -> None:
        self.handler = handler
        self.claims = claims
        self.driver = handler.driver_name
        self.data_dir = paths.plugins_data_dir / self.driver
        self.registration_socket = registration_socket_path(paths, self.driver, pod_uid)
        self.dra_socket = dra_socket_path(paths, self.driver, pod_uid)
        #: Held from before the checkpoint is loaded until the process ends (see :mod:`accel_core.instancelock`).
        self.instance = InstanceLock(instance_lock_path(paths, self.driver, pod_uid))
        self.serve_health = serve_health
        self.metrics = DraMetrics(registry)
        self._stopping = threading.Event()  #: set by stop(): health streams end, lock waits give up
        self._serial = _Serial(self.data_dir / "serialize.lock" if pod_uid else None, self._stopping)
        self._health_version = 0
        self._health_cond = threading.Condition()
        self._streams: dict[int, None] = {}  #: open health streams, oldest first (guarded by _health_cond)
        self._stream_ids = itertools.count()
        self._servers: list[grpc.aio.Server] = []
        self._dra_server: grpc.Server | None = None
        #: The kubelet's last registration answers (bounded: :meth:`registration_answered`).
        self.registration_status: asyncio.Queue[tuple[bool, str]] = asyncio.Queue(REGISTRATION_STATUS_KEPT)
        self._rejections = Throttle(log, period=60.0)
        #: Set once the kubelet has confirmed a registration of this process's sockets.
        self.registered_once = asyncio.Event()

    @property
    def supported_versions(self) -> list[str]:
        versions = [DRA_V1_SERVICE, DRA_V1BETA1_SERVICE]
        if self.serve_health:
            versions.append(DRA_HEALTH_V1ALPHA1_SERVICE)
        return versions

    # -- life cycle ----------------------------------------------------------------------------------------------
    async def start(self) -> None:
        """Serve the DRA endpoint first, then the registration socket (the kubelet dials in as soon as it sees it)."""
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.registration_socket.parent.mkdir(parents=True, exist_ok=True)
        self._stopping.clear()
        dra = grpc.server(ThreadPoolExecutor(DRA_SERVER_THREADS, thread_name_prefix="dra-grpc"))
        d1_grpc.add_DRAPluginServicer_to_server(DraV1Service(self), dra)
        d1b_grpc.add_DRAPluginServicer_to_server(DraV1beta1Service(self), dra)
        if self.serve_health:
            hp_grpc.add_DRAResourceHealthServicer_to_server(HealthService(self), dra)
        unlink_stale(self.dra_socket)
        dra.add_insecure_port(f"unix://{self.dra_socket}")
        dra.start()
        self._dra_server = dra
        reg = grpc.aio.server()
        rp_grpc.add_RegistrationServicer_to_server(RegistrationService(self), reg)
        await self._bind(reg, self.registration_socket)
        log.info("DRA plugin serving", extra=kv(driver=self.driver, registration=str(self.registration_socket),
                                                endpoint=str(self.dra_socket),
                                                versions=",".join(self.supported_versions)))

    async def _bind(self, server: grpc.aio.Server, path: Path) -> None:
        unlink_stale(path)
        server.add_insecure_port(f"unix://{path}")
        await server.start()
        self._servers.append(server)

    async def stop(self) -> None:
        """Stop serving and remove our own sockets (registration first, so the kubelet deregisters us)."""
        for server in reversed(self._servers):
            await server.stop(grace=0.5)
        self._servers.clear()
        self._stopping.set()  # calls waiting for the other pod's lock give up
        self.wake_health_streams()  # and the health streams end
        if self._dra_server is not None:
            stopped = self._dra_server.stop(grace=0.5)
            await asyncio.to_thread(stopped.wait, 5)
            self._dra_server = None
        for path in (self.registration_socket, self.dra_socket):
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
        self.metrics.registered.labels(self.driver).set(0)

    def registration_answered(self, registered: bool, error: str) -> None:
        """The kubelet's NotifyRegistrationStatus: logged (a rejection at most once a minute), the registered gauge,
        and the answer kept (its error cut), dropping the oldest kept one when the queue is full."""
        if registered:
            log.info("kubelet registered the DRA plugin", extra=kv(driver=self.driver))
            self.metrics.registered.labels(self.driver).set(1)
            self.registered_once.set()
        else:
            self._rejections.log(
                logging.ERROR, "kubelet REJECTED the DRA plugin registration; check the kubelet version and that DRA "
                "is on", extra=kv(driver=self.driver, error=cut(error)))
            self.metrics.registered.labels(self.driver).set(0)
        if self.registration_status.full():
            with contextlib.suppress(asyncio.QueueEmpty):
                self.registration_status.get_nowait()
        self.registration_status.put_nowait((registered, cut(error)))

    def sockets_present(self) -> bool:
        return self.registration_socket.exists() and self.dra_socket.exists()

    # -- claims --------------------------------------------------------------------------------------------------
    def prepare_claims_blocking(self, claims: list[ClaimRef]) -> Results:
        """Prepare the claims of one request in this thread (a DRA server thread); each UID maps to (devices,
        error)."""
        return self._answer("prepare", claims, *self.prepare(claims))

    def unprepare_claims_blocking(self, claims: list[ClaimRef]) -> Results:
        """Unprepare the claims of one request in this thread (a DRA server thread)."""
        return self._answer("unprepare", claims, *self.unprepare(claims))

    async def unprepare_claims(self, claims: list[ClaimRef]) -> Results:
        """:meth:`unprepare_claims_blocking` from the event loop (the stale-claim cleanup), in a worker thread."""
        return await asyncio.to_thread(self.unprepare_claims_blocking, claims)

    def prepare(self, claims: Sequence[ClaimRef]) -> tuple[Outcomes, float]:
        """One prepare request in this thread, before it is answered: the claims the handler names read first
        (outside the locks), then, under them, any it names now that were not (another process unprepared them
        meanwhile) and the handler's prepare with the objects read. Each UID's devices or exception, and the seconds
        under the locks."""
        if not claims:
            return {}, 0.0
        try:
            reads = dict(self.claims.read_all(self.handler.claims_to_read(claims)))
        except Exception as exc:  # a bug: every claim of the request reports it
            log.exception("unexpected error", extra=kv(driver=self.driver, claims=len(claims)))
            return {c.uid: exc for c in claims}, 0.0

        def work() -> Outcomes:
            missing = [c for c in self.handler.claims_to_read(claims, locked=True) if c.uid not in reads]
            if missing:
                reads.update(self.claims.read_all(missing))
            return self.handler.prepare_blocking(claims, reads)

        return self._locked(claims, work)

    def unprepare(self, claims: Sequence[ClaimRef]) -> tuple[Outcomes, float]:
        """One unprepare request in this thread, under the locks: each UID's None or exception, and the seconds."""
        if not claims:
            return {}, 0.0
        return self._locked(claims, lambda: self.handler.unprepare_blocking(claims))

    @contextlib.asynccontextmanager
    async def exclusive(self) -> AsyncIterator[None]:
        """Hold the locks prepares and unprepares hold (for work at start that must not interleave with another
        pod's prepare during a rolling update, such as removing orphan CDI specs)."""
        async with self._serial.held_async():
            yield

    def _locked(self, claims: Sequence[ClaimRef], work: Callable[[], Outcomes]) -> tuple[Outcomes, float]:
        """``work`` under the locks: its outcomes and the seconds it took; every claim gets the ClaimError of a lock
        that cannot be had (stopping, no lock file), or the exception of a handler bug."""
        start = time.perf_counter()
        try:
            with self._serial.held():
                start = time.perf_counter()  # the time under the locks
                results = work()
            return results, time.perf_counter() - start
        except ClaimError as exc:  # stopped while waiting for the other pod's lock, or no lock file
            return {c.uid: exc for c in claims}, 0.0
        except Exception as exc:  # a handler bug: every claim of the request reports it
            log.exception("unexpected error", extra=kv(driver=self.driver, claims=len(claims)))
            return {c.uid: exc for c in claims}, time.perf_counter() - start

    def _answer(self, operation: str, claims: list[ClaimRef], results: Outcomes, elapsed: float) -> Results:
        """Each claim's entry in the answer, with its metrics and log line, as if done one at a time."""
        out: Results = {}
        for claim in claims:
            result = results.get(claim.uid)
            if isinstance(result, BaseException):
                out[claim.uid] = self._settled(operation, claim, None, result, elapsed)
            else:
                out[claim.uid] = self._settled(operation, claim, result or [], None, elapsed)
        return out

    def _settled(self, operation: str, claim: ClaimRef, devices: list[PreparedDevice] | None,
                 exc: BaseException | None, elapsed: float) -> tuple[list[PreparedDevice], str]:
        """A claim's entry in the answer, with its metrics and log line."""
        if exc is None:
            entry, result = (devices or [], ""), "ok"
        elif isinstance(exc, ClaimError):
            entry, result = ([], f"{operation} claim {claim}: {exc}"), "error"
        else:  # never fail the RPC for one claim's bug
            log.error("unexpected error", exc_info=exc, extra=kv(driver=self.driver, claim=str(claim)))
            entry, result = ([], f"{operation} claim {claim}: internal error: {exc}"), "error"
        self.metrics.requests.labels(self.driver, operation, result).inc()
        self.metrics.seconds.labels(self.driver, operation).observe(elapsed)
        level = logging.INFO if result == "ok" else logging.WARNING
        log.log(level, f"{operation} {result}", extra=kv(driver=self.driver, claim=str(claim), devices=len(entry[0]),
                                                          seconds=round(elapsed, 4), error=cut(entry[1]) or None))
        return entry

    # -- health --------------------------------------------------------------------------------------------------
    async def health_changed(self) -> None:
        """Tell open health streams to send the full list again."""
        with self._health_cond:
            self._health_version += 1
            self._health_cond.notify_all()

    def health_updates(self, active: Callable[[], bool]) -> Iterator[list[DeviceHealthReport]]:
        """The full list now, then again after every change, while ``active()`` and until a newer stream ends this
        one, the oldest of more than :data:`MAX_HEALTH_STREAMS` (a DRA server thread waits here)."""
        stream = next(self._stream_ids)
        with self._health_cond:
            self._streams[stream] = None  # oldest first
            while len(self._streams) > MAX_HEALTH_STREAMS:
                oldest = next(iter(self._streams))
                del self._streams[oldest]
                log.info("too many health streams: ending the oldest", extra=kv(driver=self.driver,
                                                                               most=MAX_HEALTH_STREAMS))
            self._health_cond.notify_all()  # the ended stream's thread looks again and returns
        try:
            seen = -1
            while True:
                with self._health_cond:
                    while (self._health_version == seen and not self._stopping.is_set() and active()
                           and stream in self._streams):
                        self._health_cond.wait()
                    if self._stopping.is_set() or not active() or stream not in self._streams:
                        return
                    seen = self._health_version
                yield self.handler.health() or []
        finally:
            with self._health_cond:
                self._streams.pop(stream, None)

    def wake_health_streams(self) -> None:
        """Let every waiting health stream look again (at the version, the stop, its call's state)."""
        with self._health_cond:
            self._health_cond.notify_all()
