"""The /metrics HTTP endpoint every daemon serves: one thread, bounded work, answers from a cached snapshot.

Why not ``prometheus_client.start_http_server``: it starts a thread per connection and collects the registry per
request, so a scrape flood re-reads sysfs in parallel and competes with the daemon for the GIL (Allocate latency
went from milliseconds to a hundred), and slow or half-open connections pile up threads that shutdown waits for.

Here, on one thread with its own event loop:

- the registry is collected into a snapshot at most once per ``max_age`` seconds (in a short-lived helper thread,
  so the loop keeps accepting), whatever the number of scrapes; every response in between is the cached bytes
  (gzip too, when the scraper accepts it);
- responses are paced by a token bucket (``rate`` per second, FIFO), so a flood costs a bounded share of CPU;
- at most ``max_connections`` are open; a new one evicts the longest-waiting idle connection, and a request must
  arrive whole within ``request_timeout`` seconds (slowloris) and a response be taken within ``write_timeout``;
- :meth:`MetricsServer.shutdown` closes everything at once; the thread is a daemon thread, so nothing it does can
  hold up the process's exit.

Paths: ``/metrics`` (text format 0.0.4), ``/healthz`` (``ok``) and ``/readyz`` (``ok``, or 503 with the reason the
daemon gives for not serving, e.g. a device plugin standing down for the DRA driver); GET and HEAD; HTTP/1.1
keep-alive.
"""

from __future__ import annotations

import asyncio
import contextlib
import gzip
import ipaddress
import logging
import socket
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_PLAIN_0_0_4

from accel_core.logs import kv

log = logging.getLogger(__name__)

MAX_REQUEST_HEAD = 8192


@dataclass(frozen=True)
class _Snapshot:
    taken: float
    plain: bytes
    gzipped: bytes


class _TokenBucket:
    """``rate`` tokens per second up to ``burst``; :meth:`take` waits its turn (first come, first served)."""

    def __init__(self, rate: float, burst: int) -> None:
        self._rate = rate
        self._burst = float(burst)
        self._tokens = float(burst)
        self._stamp = time.monotonic()
        self._lock = asyncio.Lock()

    async def take(self) -> None:
        async with self._lock:
            while True:
                now = time.monotonic()
                self._tokens = min(self._burst, self._tokens + (now - self._stamp) * self._rate)
                self._stamp = now
                if self._tokens >= 1:
                    self._tokens -= 1
                    return
                await asyncio.sleep((1 - self._tokens) / self._rate)


class _Conn:
    __slots__ = ("writer", "idle")

    def __init__(self, writer: asyncio.StreamWriter) -> None:
        self.writer = writer
        self.idle = True  # waiting for a request (evictable)


class MetricsServer:
    """Serves ``registry`` on ``address:port`` (see the module docstring). ``start`` binds before returning."""

    def __init__(self, registry: CollectorRegistry, address: str, port: int, *, max_age: float = 2.0,
                 max_connections: int = 64, request_timeout: float = 5.0, idle_timeout: float = 60.0,
                 write_timeout: float = 10.0, rate: float = 20.0, burst: int = 10,
                 not_ready: Callable[[], str | None] | None = None) -> None:
        self.registry = registry
        self.not_ready = not_ready
        self.address = address
        self.requested_port = port
        self.max_age = max_age
        self.max_connections = max_connections
        self.request_timeout = request_timeout
        self.idle_timeout = idle_timeout
        self.write_timeout = write_timeout
        self.port = 0
        self.collections = 0  #: how many times the registry was collected (for tests and the benchmark)
        self._sock: socket.socket | None = None
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stopped: asyncio.Event | None = None
        self._conns: OrderedDict[_Conn, None] = OrderedDict()
        self._snapshot: _Snapshot | None = None
        self._refreshing: asyncio.Future[_Snapshot] | None = None
        self._ready = threading.Event()
        self._bucket = _TokenBucket(rate, burst)

    @property
    def open_connections(self) -> int:
        """How many connections the server holds now (for tests and the benchmark)."""
        return len(self._conns)

    # -- life cycle ------------------------------------------------------------------------------------------------
    def start(self) -> None:
        """Bind and listen (OSError if the address cannot be used), then serve on a daemon thread."""
        family = socket.AF_INET6 if ipaddress.ip_address(self.address).version == 6 else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6 and self.address == "::":
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
            sock.bind((self.address, self.requested_port))
            sock.listen(128)
            sock.setblocking(False)
        except BaseException:
            sock.close()
            raise
        self._sock = sock
        self.port = sock.getsockname()[1]
        self._thread = threading.Thread(target=self._run, name="metrics-http", daemon=True)
        self._thread.start()
        self._ready.wait(5)

    def shutdown(self, timeout: float = 1.0) -> None:
        """Stop serving and close every connection; waits at most ``timeout`` seconds for the thread."""
        loop, stopped = self._loop, self._stopped
        if loop is not None and stopped is not None:
            with contextlib.suppress(RuntimeError):  # the loop is already closed
                loop.call_soon_threadsafe(stopped.set)
        if self._thread is not None:
            self._thread.join(timeout)

    def _run(self) -> None:
        loop = asyncio.new_event_loop()
        self._loop = loop
        try:
            loop.run_until_complete(self._serve())
        except Exception:
            log.exception("metrics server failed")
        finally:
            self._ready.set()
            with contextlib.suppress(Exception):
                loop.run_until_complete(loop.shutdown_asyncgens())
            loop.close()

    async def _serve(self) -> None:
        assert self._sock is not None
        self._stopped = asyncio.Event()
        server = await asyncio.start_server(self._handle, sock=self._sock, limit=MAX_REQUEST_HEAD)
        self._ready.set()
        try:
            await self._stopped.wait()
        finally:
            server.close()
            for conn in list(self._conns):
                conn.writer.transport.abort()
            self._conns.clear()
            tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    # -- connections -----------------------------------------------------------------------------------------------
    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        conn = _Conn(writer)
        if not self._admit(conn):
            return
        try:
            timeout = self.request_timeout
            while conn in self._conns:  # an evicted connection is done
                conn.idle = True
                self._conns.move_to_end(conn)
                try:
                    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), timeout)
                except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, TimeoutError, ConnectionError):
                    return
                conn.idle = False
                keep_alive = await self._respond(head, writer)
                if not keep_alive:
                    return
                timeout = self.idle_timeout
        except (ConnectionError, TimeoutError):
            return
        except asyncio.CancelledError:
            return  # shutting down; a cancelled handler would make asyncio log an error per connection
        finally:
            self._conns.pop(conn, None)
            writer.transport.abort()

    def _admit(self, conn: _Conn) -> bool:
        """Track ``conn``; beyond the limit, drop the idle connection that has waited longest (or this one)."""
        if len(self._conns) >= self.max_connections:
            victim = next((c for c in self._conns if c.idle), None)
            if victim is None:
                conn.writer.transport.abort()
                return False
            self._conns.pop(victim, None)
            victim.writer.transport.abort()
        self._conns[conn] = None
        return True

    async def _respond(self, head: bytes, writer: asyncio.StreamWriter) -> bool:
        """Answer one request; True to keep the connection open."""
        lines = head.decode("latin-1").split("\r\n")
        parts = lines[0].split(" ")
        if len(parts) != 3 or not parts[2].startswith("HTTP/1."):
            await self._send(writer, 400, b"bad request\n", "text/plain", keep_alive=False)
            return False
        method, target, version = parts
        headers = {}
        for line in lines[1:]:
            name, sep, value = line.partition(":")
            if sep:
                headers[name.strip().lower()] = value.strip().lower()
        connection = headers.get("connection", "")
        keep_alive = "close" not in connection if version == "HTTP/1.1" else "keep-alive" in connection
        path = target.split("?", 1)[0]
        if method not in ("GET", "HEAD"):
            await self._send(writer, 405, b"only GET and HEAD\n", "text/plain", keep_alive, extra=("Allow: GET, HEAD",))
            return keep_alive
        if path == "/healthz":
            await self._send(writer, 200, b"ok\n", "text/plain", keep_alive, head_only=method == "HEAD")
            return keep_alive
        if path == "/readyz":
            reason = self.not_ready() if self.not_ready is not None else None
            status, body = (200, b"ok\n") if reason is None else (503, f"not ready: {reason}\n".encode())
            await self._send(writer, status, body, "text/plain; charset=utf-8", keep_alive,
                             head_only=method == "HEAD")
            return keep_alive
        if path != "/metrics":
            await self._send(writer, 404, b"see /metrics\n", "text/plain", keep_alive, head_only=method == "HEAD")
            return keep_alive
        await self._bucket.take()
        try:
            snap = await self._current()
        except Exception as exc:
            log.warning("metrics collection failed", extra=kv(error=exc))
            await self._send(writer, 500, b"metrics collection failed\n", "text/plain", keep_alive)
            return keep_alive
        use_gzip = "gzip" in headers.get("accept-encoding", "")
        body = snap.gzipped if use_gzip else snap.plain
        extra = ("Content-Encoding: gzip",) if use_gzip else ()
        await self._send(writer, 200, body, CONTENT_TYPE_PLAIN_0_0_4, keep_alive, extra=extra,
                         head_only=method == "HEAD")
        return keep_alive

    async def _send(self, writer: asyncio.StreamWriter, status: int, body: bytes, content_type: str,
                    keep_alive: bool, *, extra: tuple[str, ...] = (), head_only: bool = False) -> None:
        reason = {200: "OK", 400: "Bad Request", 404: "Not Found", 405: "Method Not Allowed",
                  500: "Internal Server Error", 503: "Service Unavailable"}[status]
        lines = [f"HTTP/1.1 {status} {reason}", f"Content-Type: {content_type}", f"Content-Length: {len(body)}",
                 f"Connection: {'keep-alive' if keep_alive else 'close'}", *extra]
        writer.write(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1"))
        if not head_only:
            writer.write(body)
        await asyncio.wait_for(writer.drain(), self.write_timeout)

    # -- snapshot --------------------------------------------------------------------------------------------------
    async def _current(self) -> _Snapshot:
        snap = self._snapshot
        if snap is not None and time.monotonic() - snap.taken < self.max_age:
            return snap
        if self._refreshing is None or self._refreshing.done():
            self._refreshing = self._start_refresh()
        return await asyncio.shield(self._refreshing)

    def _start_refresh(self) -> asyncio.Future[_Snapshot]:
        """Collect the registry on a short-lived daemon thread (a slow collector never blocks this loop)."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[_Snapshot] = loop.create_future()

        def collect() -> None:
            try:
                plain = generate_latest(self.registry)
                snap = _Snapshot(time.monotonic(), plain, gzip.compress(plain, compresslevel=1))
            except Exception as exc:  # handed to the waiting scrapes
                with contextlib.suppress(RuntimeError):
                    loop.call_soon_threadsafe(self._failed, future, exc)
                return
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(self._refreshed, future, snap)

        self.collections += 1
        threading.Thread(target=collect, name="metrics-collect", daemon=True).start()
        return future

    @staticmethod
    def _failed(future: asyncio.Future[_Snapshot], exc: Exception) -> None:
        if not future.done():
            future.set_exception(exc)

    def _refreshed(self, future: asyncio.Future[_Snapshot], snap: _Snapshot) -> None:
        self._snapshot = snap
        if not future.done():
            future.set_result(snap)


def serve_metrics(registry: CollectorRegistry, port: int, address: str, *,
                  not_ready: Callable[[], str | None] | None = None) -> MetricsServer | None:
    """Start a :class:`MetricsServer`; port 0 disables it. Logs and returns None when it cannot listen."""
    if port <= 0:
        return None
    server = MetricsServer(registry, address, port, not_ready=not_ready)
    try:
        server.start()
    except (OSError, ValueError) as exc:
        log.error("metrics server could not listen; continuing without it",
                  extra=kv(address=address, port=port, error=exc))
        return None
    log.info("metrics server listening", extra=kv(address=address, port=server.port))
    return server
