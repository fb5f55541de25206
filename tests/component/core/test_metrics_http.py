"""Issue 14 item 5: the metrics endpoint over real sockets: cached snapshot, bounded connections and work, slow and
half-open clients, prompt shutdown, loopback by default; and a real daemon stopping promptly under that load."""

from __future__ import annotations

import gzip
import http.client
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterable, Iterator
from pathlib import Path

import psutil
import pytest
from accel_rig.polling import poll_until
from hostcache import copy_host
from prometheus_client import CollectorRegistry, Counter
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from accel_core.metrics_http import MetricsServer


class CountingCollector(Collector):
    """Counts collections; optionally slow (like a sysfs walk on a big node)."""

    def __init__(self, delay: float = 0.0) -> None:
        self.calls = 0
        self.delay = delay

    def collect(self) -> Iterable[Metric]:
        self.calls += 1
        time.sleep(self.delay)
        gauge = GaugeMetricFamily("test_collections", "collections so far")
        gauge.add_metric([], self.calls)
        yield gauge


@pytest.fixture
def served() -> Iterator[tuple[MetricsServer, CountingCollector]]:
    registry = CollectorRegistry()
    collector = CountingCollector()
    registry.register(collector)
    Counter("test_events", "events", registry=registry).inc(3)
    server = MetricsServer(registry, "127.0.0.1", 0, max_age=60.0, request_timeout=1.0, max_connections=16,
                           rate=1000.0, burst=1000)
    server.start()
    yield server, collector
    server.shutdown()


def get(port: int, path: str = "/metrics", headers: dict[str, str] | None = None,
        timeout: float = 5.0) -> tuple[int, dict[str, str], bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        conn.request("GET", path, headers=headers or {})
        resp = conn.getresponse()
        return resp.status, {k.lower(): v for k, v in resp.getheaders()}, resp.read()
    finally:
        conn.close()


def half_open(port: int, count: int, payload: bytes = b"GET /metr") -> list[socket.socket]:
    socks = []
    for _ in range(count):
        s = socket.create_connection(("127.0.0.1", port), timeout=5)
        s.sendall(payload)
        socks.append(s)
    return socks


def test_scrapes_share_one_snapshot(served: tuple[MetricsServer, CountingCollector]) -> None:
    server, collector = served
    bodies = [get(server.port)[2] for _ in range(30)]
    assert collector.calls == 1 and server.collections == 1
    assert len(set(bodies)) == 1
    text = bodies[0].decode()
    assert "test_collections 1.0" in text and "test_events_total 3.0" in text
    status, headers, zipped = get(server.port, headers={"Accept-Encoding": "gzip"})
    assert status == 200 and headers["content-encoding"] == "gzip"
    assert gzip.decompress(zipped) == bodies[0]
    assert headers["content-type"].startswith("text/plain; version=0.0.4")


def test_snapshot_is_refreshed_after_max_age() -> None:
    registry = CollectorRegistry()
    collector = CountingCollector()
    registry.register(collector)
    server = MetricsServer(registry, "127.0.0.1", 0, max_age=0.2)
    server.start()
    try:
        assert b"test_collections 1.0" in get(server.port)[2]
        time.sleep(0.3)
        assert b"test_collections 2.0" in get(server.port)[2]
    finally:
        server.shutdown()


def test_other_paths_and_methods(served: tuple[MetricsServer, CountingCollector]) -> None:
    server, _ = served
    assert get(server.port, "/healthz")[0:3:2] == (200, b"ok\n")
    assert get(server.port, "/etc/passwd")[0] == 404
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=5)
    conn.request("POST", "/metrics", body=b"x")
    assert conn.getresponse().status == 405
    conn.close()
    with socket.create_connection(("127.0.0.1", server.port), timeout=5) as s:
        s.sendall(b"garbage\r\n\r\n")
        assert s.recv(100).startswith(b"HTTP/1.1 400")


def test_keep_alive_serves_several_requests_on_one_connection(served: tuple[MetricsServer, CountingCollector]) -> None:
    server, _ = served
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=5)
    for _ in range(5):
        conn.request("GET", "/metrics")
        resp = conn.getresponse()
        assert resp.status == 200 and b"test_events_total" in resp.read()
    conn.close()


def test_300_half_open_connections_neither_deafen_it_nor_spawn_threads(
        served: tuple[MetricsServer, CountingCollector]) -> None:
    server, _ = served
    threads_before = threading.active_count()
    socks = half_open(server.port, 300)
    try:
        assert threading.active_count() <= threads_before + 1  # at most one collection helper, never one per socket
        t0 = time.monotonic()
        status, _, body = get(server.port, timeout=5)
        assert status == 200 and b"test_events_total" in body
        assert time.monotonic() - t0 < 2.0
        t0 = time.monotonic()
        server.shutdown()
        assert time.monotonic() - t0 < 1.5
    finally:
        for s in socks:
            s.close()


def test_slowloris_is_cut_off_after_the_request_timeout(served: tuple[MetricsServer, CountingCollector]) -> None:
    server, _ = served
    with socket.create_connection(("127.0.0.1", server.port), timeout=5) as s:
        t0 = time.monotonic()
        closed_after = None
        for byte in b"GET /metrics HTTP/1.1\r\nHost: x\r\n":  # one byte every 0.1 s: never a whole request
            try:
                s.sendall(bytes([byte]))
            except OSError:
                closed_after = time.monotonic() - t0
                break
            time.sleep(0.1)
        if closed_after is None:
            s.settimeout(3)
            assert s.recv(1) == b""
            closed_after = time.monotonic() - t0
    assert closed_after < 3.0  # request_timeout is 1 s in the fixture


def test_over_the_limit_the_oldest_idle_connection_gives_way(served: tuple[MetricsServer, CountingCollector]) -> None:
    server, _ = served
    socks = half_open(server.port, 16)  # max_connections
    try:
        poll_until(lambda: server.open_connections == 16, "the server to hold the 16 connections")
        assert get(server.port, timeout=3)[0] == 200
        socks[0].settimeout(3)
        assert socks[0].recv(1) == b""  # evicted for the newcomer
    finally:
        for s in socks:
            s.close()


def test_slow_collection_keeps_the_server_answering() -> None:
    registry = CollectorRegistry()
    slow = CountingCollector(delay=1.0)
    registry.register(slow)
    server = MetricsServer(registry, "127.0.0.1", 0)
    server.start()
    try:
        waiter = threading.Thread(target=get, args=(server.port,))
        waiter.start()
        poll_until(lambda: slow.calls == 1, "the slow collection to start")
        t0 = time.monotonic()
        assert get(server.port, "/healthz")[0] == 200  # answered while the collection runs
        assert time.monotonic() - t0 < 0.5
        waiter.join(5)
        t0 = time.monotonic()
    finally:
        server.shutdown()


def test_flood_is_paced_by_the_token_bucket() -> None:
    registry = CollectorRegistry()
    Counter("test_events", "events", registry=registry)
    server = MetricsServer(registry, "127.0.0.1", 0, rate=20.0, burst=5)
    server.start()
    try:
        conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=10)
        t0 = time.monotonic()
        for _ in range(25):
            conn.request("GET", "/metrics")
            conn.getresponse().read()
        elapsed = time.monotonic() - t0
        conn.close()
    finally:
        server.shutdown()
    assert elapsed >= (25 - 5) / 20 * 0.9  # 5 at once, then 20 per second


def test_ipv6_loopback() -> None:
    if not socket.has_ipv6:
        pytest.skip("no IPv6 on this machine")
    server = MetricsServer(CollectorRegistry(), "::1", 0)
    try:
        server.start()
    except OSError as exc:
        pytest.skip(f"IPv6 loopback unavailable: {exc}")
    try:
        conn = http.client.HTTPConnection("::1", server.port, timeout=5)
        conn.request("GET", "/healthz")
        assert conn.getresponse().status == 200
        conn.close()
    finally:
        server.shutdown()


# ------------------------------------------------------------------------------------------------ a real daemon


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_listening(pid: int, port: int, timeout: float = 30.0) -> list[str]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = [c.laddr.ip for c in psutil.Process(pid).net_connections("inet")
                 if c.status == psutil.CONN_LISTEN and c.laddr.port == port]
        if found:
            return found
        time.sleep(0.1)
    raise AssertionError(f"nothing listens on port {port}")


def test_daemon_listens_on_loopback_and_stops_promptly_under_half_open_connections(short_tmp: Path) -> None:
    copy_host(short_tmp / "host", "p4d.24xlarge")
    (short_tmp / "kubelet").mkdir()
    port = free_port()
    env = {"PATH": "/usr/bin:/bin", "METRICS_PORT": str(port)}
    proc = subprocess.Popen([sys.executable, "-m", "efa_plugin.cli", "serve", "--host-root", str(short_tmp / "host"),
                             "--kubelet-root", str(short_tmp / "kubelet"),
                             "--device-plugins-dir", str(short_tmp / "kubelet" / "device-plugins")], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    socks: list[socket.socket] = []
    try:
        assert wait_listening(proc.pid, port) == ["127.0.0.1"]  # METRICS_ADDRESS unset: this node only
        deadline = time.monotonic() + 20  # the first discovery fills the snapshot after the port opens
        while b"efa_device_healthy" not in get(port)[2]:
            assert time.monotonic() < deadline, "device metrics never appeared"
            time.sleep(0.1)
        socks = half_open(port, 300)
        assert get(port)[0] == 200
        t0 = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=10) == 0
        assert time.monotonic() - t0 < 2.0
    finally:
        for s in socks:
            s.close()
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        assert proc.stderr is not None
        err = proc.stderr.read().decode()
        proc.stderr.close()
    assert "Traceback" not in err
