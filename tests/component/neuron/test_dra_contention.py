"""Issue 25: what one client or fault must not do to the other DRA calls. Many open health streams, a slow API
server, an unusable lock file or CDI directory, and a second copy of the driver on the same sockets; each over
real unix sockets (the kubelet stand-in) or as real processes."""

from __future__ import annotations

import asyncio
import errno
import os
import signal
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import grpc
import pytest
from accel_rig.kubelet_standin import socket_files
from accel_rig.polling import poll_until
from aiohttp import web
from drarig import DriverRig, claim, served_paths
from hostcache import copy_host
from lightkube import KubeConfig

import accel_core.dra.cdi as cdi_module
import accel_core.dra.pluginserver as plugin_module
from accel_core.dra.claimget import DirectClaimGet
from accel_core.dra.liveness import (
    SERVING,
    HealthCheckRequest,
    HealthCheckResponse,
    LivenessServer,
    check_own_sockets,
)
from accel_core.dra.pluginserver import DraPlugin
from accel_core.fakehost import build_host
from accel_core.health import DeviceHealth
from accel_core.kubeletapi import dra_health_v1alpha1_pb2 as hp
from neuron_dra.dra.profile import NeuronProfile

DRIVER = "neuron.aws.com"
NODE = "node-a"
CLAIMS_PATH = "/apis/resource.k8s.io/v1/namespaces/{ns}/resourceclaims/{name}"  # the resource.k8s.io/v1 path


def neuron_claim(name: str, uid: str, devices: list[int]) -> dict[str, Any]:
    return claim(name, [f"neuron-device-{i}" for i in devices], driver=DRIVER, uid=uid)


class SlowApi:
    """A stand-in API server on loopback: claims by name; a claim in ``held`` is answered only once ``release``
    is set (``asked`` is set when its request came in)."""

    def __init__(self) -> None:
        self.claims: dict[str, dict[str, Any]] = {}
        self.held: set[str] = set()
        self.asked = asyncio.Event()
        self.release = asyncio.Event()

    async def handle(self, request: web.Request) -> web.Response:
        name = request.match_info["name"]
        if name in self.held:
            self.asked.set()
            await self.release.wait()
        found = self.claims.get(name)
        if found is None:
            return web.json_response({"kind": "Status", "code": 404, "message": "not found"}, status=404)
        return web.json_response(found)

    @asynccontextmanager
    async def serving(self) -> AsyncIterator[str]:
        app = web.Application()
        app.router.add_get(CLAIMS_PATH, self.handle)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        try:
            yield f"http://127.0.0.1:{runner.addresses[0][1]}"
        finally:
            self.release.set()
            await runner.cleanup()


class Rig:
    """A Neuron DRA driver and its plugin (with a pod UID, so the rolling-update file lock is in play) on an
    inf2.48xlarge fake host, reading claims from ``server`` with the direct GET, as the daemon does."""

    def __init__(self, root: Path) -> None:
        copy_host(root / "h", "inf2.48xlarge")
        self.standin, self.paths = served_paths(root, root / "h")

    @asynccontextmanager
    async def running(self, server: str = "http://127.0.0.1:1") -> AsyncIterator[DraPlugin]:
        config = KubeConfig.from_dict({
            "clusters": [{"name": "c", "cluster": {"server": server}}],
            "users": [{"name": "u", "user": {"token": "t"}}],
            "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}], "current-context": "x"}).get()
        assert config is not None
        direct = DirectClaimGet(config, keepalive=60)
        driver = DriverRig(self.paths, NeuronProfile(), api=direct, pod_uid="pod-1")
        self.store, self.cdi, self.driver = driver.store, driver.cdi, driver.driver
        await driver.plugin.start()
        try:
            yield driver.plugin
        finally:
            await driver.plugin.stop()
            direct.close()


def devices(answer: Any) -> list[str]:
    assert answer.error == "", answer.error
    return [d.device_name for d in answer.devices]


def test_a_hundred_open_health_streams_leave_prepares_and_liveness_working(short_tmp: Path) -> None:
    """Each health stream holds one of the DRA server's threads. With 100 open, a prepare must still be answered
    (the kubelet's deadline is far off) and the liveness probe must still say SERVING; the newest stream (the
    kubelet's, after a reconnect) still gets every change."""
    rig = Rig(short_tmp)

    async def scenario() -> None:
        async with rig.running() as plugin:
            conn = await rig.standin.register_dra(DRIVER)
            streams = [conn.watch_health() for _ in range(100)]
            # every stream gets its first list, or is ended to make room for newer ones
            firsts = await asyncio.wait_for(asyncio.gather(*(s.read() for s in streams)), 60)
            # The server's newest streams stay open; which of the client's concurrent opens those are is the
            # server's order of arrival, not the list's.
            alive = [s for s, first in zip(streams, firsts, strict=True)
                     if isinstance(first, hp.NodeWatchResourcesResponse)]
            assert alive
            liveness = LivenessServer(lambda: check_own_sockets(str(plugin.registration_socket),
                                                                str(plugin.dra_socket)), 0, "127.0.0.1")
            await liveness.start()
            try:
                assert liveness.port
                async with grpc.aio.insecure_channel(f"127.0.0.1:{liveness.port}") as channel:
                    check = channel.unary_unary("/grpc.health.v1.Health/Check",
                                                request_serializer=lambda r: r.SerializeToString(),
                                                response_deserializer=HealthCheckResponse.FromString)
                    resp = await check(HealthCheckRequest(service="liveness"), timeout=30)
                    assert resp.status == SERVING
            finally:
                await liveness.stop()
            # an unprepare of an unknown claim needs no API server: it only has to get a thread and the locks
            answer = await asyncio.wait_for(conn.unprepare(("ns", "u-9", "c9")), 30)
            assert answer["u-9"].error == ""  # type: ignore[attr-defined]
            rig.driver.set_health({"neuron-device-0": DeviceHealth(False, "UncorrectedErrors", "uncorrected errors")})
            await plugin.health_changed()
            updates = await asyncio.wait_for(asyncio.gather(*(s.read() for s in alive)), 30)
            got = [u for u in updates if isinstance(u, hp.NodeWatchResourcesResponse)]
            assert got, "no open stream got the change"
            for update in got:
                assert [(d.device.device_name, d.health) for d in update.devices] == [
                    ("neuron-device-0", hp.UNHEALTHY)]
            for s in streams:
                s.cancel()
            await conn.close()

    asyncio.run(scenario())


def test_a_slow_claim_read_holds_up_no_other_request(short_tmp: Path) -> None:
    """While one prepare waits for an API server that does not answer, a prepared claim is answered again, an
    unrelated claim is unprepared and another claim is prepared: none of them waits for that read. Then the slow
    one completes, with its own device."""
    rig = Rig(short_tmp)
    api = SlowApi()
    api.claims = {name: neuron_claim(name, f"u-{name}", [i]) for i, name in enumerate("abcd")}

    async def scenario() -> None:
        async with api.serving() as server, rig.running(server):
            conn = await rig.standin.register_dra(DRIVER)
            assert devices((await conn.prepare(("ns", "u-a", "a")))["u-a"]) == ["neuron-device-0"]
            assert devices((await conn.prepare(("ns", "u-c", "c")))["u-c"]) == ["neuron-device-2"]
            api.held.add("b")
            slow = asyncio.ensure_future(conn.prepare(("ns", "u-b", "b")))
            await asyncio.wait_for(api.asked.wait(), 30)
            again = await asyncio.wait_for(conn.prepare(("ns", "u-a", "a")), 30)
            assert devices(again["u-a"]) == ["neuron-device-0"]
            gone = await asyncio.wait_for(conn.unprepare(("ns", "u-c", "c")), 30)
            assert gone["u-c"].error == ""  # type: ignore[attr-defined]
            other = await asyncio.wait_for(conn.prepare(("ns", "u-d", "d")), 30)
            assert devices(other["u-d"]) == ["neuron-device-3"]
            assert not slow.done(), "the slow read was answered meanwhile: the test proves nothing"
            api.release.set()
            assert devices((await asyncio.wait_for(slow, 30))["u-b"]) == ["neuron-device-1"]
            assert sorted(c.uid for c in rig.store.claims()) == ["u-a", "u-b", "u-d"]
            await conn.close()

    asyncio.run(scenario())


class _ReadOnly:
    """Stands in for a module's ``os``: creating or removing files under ``below`` fails with EROFS, as on a file
    system mounted read-only."""

    def __init__(self, below: Path) -> None:
        self.below = str(below)

    def __getattr__(self, name: str) -> Any:
        return getattr(os, name)

    def _check(self, path: Any) -> None:
        if str(path).startswith(self.below):
            raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(path))

    def open(self, path: Any, flags: int, mode: int = 0o777, **kwargs: Any) -> int:
        if flags & (os.O_CREAT | os.O_WRONLY | os.O_RDWR):
            self._check(path)
        return os.open(path, flags, mode, **kwargs)

    def unlink(self, path: Any, **kwargs: Any) -> None:
        self._check(path)
        os.unlink(path, **kwargs)


def test_a_read_only_lock_file_fails_each_claim_not_the_call(short_tmp: Path,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """The rolling-update lock file cannot be opened (its directory is read-only): every claim of the call gets an
    error naming the file, and the RPC itself succeeds (the kubelet retries the claims)."""
    rig = Rig(short_tmp)

    async def scenario() -> None:
        async with rig.running() as plugin:
            conn = await rig.standin.register_dra(DRIVER)
            monkeypatch.setattr(plugin_module, "os", _ReadOnly(plugin.data_dir))
            answer = await conn.prepare(("ns", "u-1", "c1"), ("ns", "u-2", "c2"))
            for uid in ("u-1", "u-2"):
                error = answer[uid].error  # type: ignore[attr-defined]
                assert f"cannot open lock file {plugin.data_dir / 'serialize.lock'}: Read-only file system" in error
            gone = await conn.unprepare(("ns", "u-1", "c1"))
            assert "Read-only file system" in gone["u-1"].error  # type: ignore[attr-defined]
            monkeypatch.undo()
            await conn.close()

    asyncio.run(scenario())


def test_an_unprepare_that_cannot_remove_the_spec_fails_and_keeps_the_claim(short_tmp: Path,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """With the CDI directory read-only, an unprepare cannot remove the spec: that claim reports the failure and
    stays prepared (its devices held, its entry kept), so the kubelet retries; once the directory is writable
    again, the retry removes both."""
    rig = Rig(short_tmp)
    api = SlowApi()
    api.claims = {name: neuron_claim(name, f"u-{name}", [i]) for name, i in (("a", 0), ("b", 1), ("x", 0))}

    async def scenario() -> None:
        async with api.serving() as server, rig.running(server):
            conn = await rig.standin.register_dra(DRIVER)
            await conn.prepare(("ns", "u-a", "a"), ("ns", "u-b", "b"))
            monkeypatch.setattr(cdi_module, "os", _ReadOnly(rig.paths.cdi_root / "k8s.neuron.aws.com-claim_u-a"))
            answer = await conn.unprepare(("ns", "u-a", "a"), ("ns", "u-b", "b"))
            error = answer["u-a"].error  # type: ignore[attr-defined]
            assert f"cannot remove CDI spec {rig.cdi.spec_path('u-a')}" in error and "Read-only" in error
            assert answer["u-b"].error == ""  # type: ignore[attr-defined]
            assert rig.cdi.exists("u-a") and [c.uid for c in rig.store.claims()] == ["u-a"]
            taken = await conn.prepare(("ns", "u-x", "x"))  # wants u-a's device
            assert "already prepared" in taken["u-x"].error  # type: ignore[attr-defined]
            monkeypatch.undo()
            retry = await conn.unprepare(("ns", "u-a", "a"))
            assert retry["u-a"].error == ""  # type: ignore[attr-defined]
            assert not rig.cdi.exists("u-a") and rig.store.claims() == []
            await conn.close()

    asyncio.run(scenario())


def _serve(tmp: Path, host: Path, pod_uid: str) -> list[str]:
    return [sys.executable, "-m", "neuron_dra.dra.cli", "serve", "--host-root", str(host), "--node-name", NODE,
            "--pod-uid", pod_uid, "--kubelet-root", str(tmp / "k"), "--registrar-dir", str(tmp / "reg"),
            "--cdi-root", str(tmp / "cdi"), "--kubeconfig", str(tmp / "none"), "--metrics-port", "0",
            "--healthcheck-port", "-1"]


def _wait_for(path: Path, proc: subprocess.Popen[str]) -> None:
    poll_until(lambda: path.exists() or proc.poll() is not None, f"{path} (or the driver's exit)", 30, 0.05)
    assert path.exists(), f"{path} never appeared (exit code {proc.poll()})"


def test_a_second_instance_on_the_same_sockets_refuses_to_start(short_tmp: Path) -> None:
    """A duplicate driver (same pod UID, so the same socket names) exits 2 with one line naming the lock file and
    the first one's pid, and touches nothing: the first keeps its sockets. A rolling update's new pod (another pod
    UID) starts beside it."""
    host = build_host(short_tmp / "host", "inf2.xlarge").root
    first = subprocess.Popen(_serve(short_tmp, host, "pod-1"), stderr=subprocess.PIPE, text=True)
    rolling: subprocess.Popen[str] | None = None
    try:
        dra_dir = short_tmp / "k" / "plugins" / DRIVER
        _wait_for(dra_dir / "dra-pod-1.sock", first)
        _wait_for(short_tmp / "reg" / f"{DRIVER}-pod-1-reg.sock", first)
        second = subprocess.run(_serve(short_tmp, host, "pod-1"), capture_output=True, text=True, timeout=60)
        assert second.returncode == 2, second.stderr
        assert "Traceback" not in second.stderr
        [line] = [x for x in second.stderr.splitlines() if "level=ERROR" in x and "another instance" in x]
        assert str(dra_dir / "dra-pod-1.lock") in line and f"pid {first.pid}" in line, line
        assert first.poll() is None
        assert socket_files(dra_dir) == ["dra-pod-1.sock"]
        assert socket_files(short_tmp / "reg") == [f"{DRIVER}-pod-1-reg.sock"]
        rolling = subprocess.Popen(_serve(short_tmp, host, "pod-2"), stderr=subprocess.PIPE, text=True)
        _wait_for(short_tmp / "reg" / f"{DRIVER}-pod-2-reg.sock", rolling)
        assert rolling.poll() is None and first.poll() is None
        assert socket_files(dra_dir) == ["dra-pod-1.sock", "dra-pod-2.sock"]
    finally:
        for proc in (first, rolling):
            if proc is not None and proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.communicate(timeout=30)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.communicate()
