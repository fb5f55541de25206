"""The generic DRA plugin against the kubelet stand-in's registration handshake and DRA calls, over unix sockets."""

from __future__ import annotations

import asyncio
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path

import grpc
import pytest
from accel_rig.kubelet_standin import KubeletStandIn, socket_files
from drarig import served_paths
from lockspy import FlockBusySpy

import accel_core.dra.pluginserver as plugin_module
from accel_core.dra.pluginserver import DraPlugin
from accel_core.dra.types import ClaimError, ClaimReads, ClaimRef, DeviceHealthReport, PreparedDevice
from accel_core.kubeletapi import dra_health_v1alpha1_pb2 as hp

DRIVER = "toy.example.com"


class ToyHandler:
    """A handler with production's calls (:class:`~accel_core.dra.types.DraHandler`), run in the DRA server's
    thread, and the plugin's claim source: reads first (outside the locks), then prepare or unprepare under them."""

    driver_name = DRIVER

    def __init__(self) -> None:
        self.prepared: dict[str, list[PreparedDevice]] = {}
        self.calls: list[str] = []
        self.healthy = True

    def claims_to_read(self, claims: Sequence[ClaimRef], *, locked: bool = False) -> list[ClaimRef]:
        return list(claims)

    def read_all(self, claims: Sequence[ClaimRef]) -> dict[str, None]:
        self.calls += [f"read:{c.name}" for c in claims]
        return dict.fromkeys((c.uid for c in claims), None)

    def prepare_blocking(self, claims: Sequence[ClaimRef], reads: ClaimReads
                         ) -> dict[str, list[PreparedDevice] | Exception]:
        out: dict[str, list[PreparedDevice] | Exception] = {}
        for claim in claims:
            try:
                out[claim.uid] = self.prepare_one(claim)
            except Exception as exc:
                out[claim.uid] = exc
        return out

    def prepare_one(self, claim: ClaimRef) -> list[PreparedDevice]:
        self.calls.append(f"prepare:{claim.name}")
        if claim.name == "bad":
            raise ClaimError("opaque config: unknown field 'colour'")
        if claim.name == "boom":
            raise RuntimeError("driver bug")
        devs = [PreparedDevice("node-a", "toy-0", (f"k8s.toy/claim={claim.uid}-toy-0",), ("req",), "s1")]
        self.prepared[claim.uid] = devs
        return devs

    def unprepare_blocking(self, claims: Sequence[ClaimRef]) -> dict[str, Exception | None]:
        for claim in claims:
            self.calls.append(f"unprepare:{claim.name}")
            self.prepared.pop(claim.uid, None)
        return {c.uid: None for c in claims}

    def health(self) -> list[DeviceHealthReport] | None:
        return [DeviceHealthReport("node-a", "toy-0", self.healthy, "" if self.healthy else "x" * 2000, 30),
                DeviceHealthReport("node-a", "toy-1", None)]


async def _start(short_tmp: Path, pod_uid: str | None = "pod-123", handler: ToyHandler | None = None
                 ) -> tuple[KubeletStandIn, DraPlugin, ToyHandler]:
    standin, paths = served_paths(short_tmp)
    handler = handler or ToyHandler()
    plugin = DraPlugin(handler, paths, claims=handler, pod_uid=pod_uid)
    await plugin.start()
    return standin, plugin, handler


def test_registration_handshake_and_socket_names(short_tmp: Path) -> None:
    async def scenario() -> None:
        standin, plugin, _ = await _start(short_tmp)
        assert socket_files(standin.registry_dir) == [f"{DRIVER}-pod-123-reg.sock"]
        conn = await standin.register_dra(DRIVER)
        assert conn.info.type == "DRAPlugin"
        assert conn.supported == ["v1.DRAPlugin", "v1beta1.DRAPlugin", "v1alpha1.DRAResourceHealth"]
        assert conn.version == "v1.DRAPlugin"
        assert conn.info.endpoint == str(standin.root / "plugins" / DRIVER / "dra-pod-123.sock")
        assert await asyncio.wait_for(plugin.registration_status.get(), 2) == (True, "")
        await conn.close()
        await plugin.stop()
        assert socket_files(standin.registry_dir) == []
        assert not plugin.dra_socket.exists()
    asyncio.run(scenario())


def test_prepare_both_versions_with_per_claim_errors(short_tmp: Path) -> None:
    async def scenario() -> None:
        standin, plugin, handler = await _start(short_tmp, pod_uid=None)
        conn = await standin.register_dra(DRIVER)
        for version in ("v1.DRAPlugin", "v1beta1.DRAPlugin"):
            resp = await conn.prepare(("ns", "u1", "good"), ("ns", "u2", "bad"), ("ns", "u3", "boom"), version=version)
            assert set(resp) == {"u1", "u2", "u3"}, "every claim must have an entry"
            good = resp["u1"]
            assert good.error == ""  # type: ignore[attr-defined]
            dev = good.devices[0]  # type: ignore[attr-defined]
            assert (dev.pool_name, dev.device_name, list(dev.cdi_device_ids), list(dev.request_names)) == (
                "node-a", "toy-0", ["k8s.toy/claim=u1-toy-0"], ["req"])
            if version == "v1.DRAPlugin":
                assert dev.HasField("share_id") and dev.share_id == "s1"
            assert "unknown field 'colour'" in resp["u2"].error  # type: ignore[attr-defined]
            assert "ns/bad" in resp["u2"].error  # type: ignore[attr-defined]
            assert "internal error" in resp["u3"].error  # type: ignore[attr-defined]
            un = await conn.unprepare(("ns", "u1", "good"), ("ns", "gone", "deleted-already"), version=version)
            assert set(un) == {"u1", "gone"} and all(v.error == "" for v in un.values())  # type: ignore[attr-defined]
        await conn.close()
        await plugin.stop()
    asyncio.run(scenario())


class OverlapProbe:
    """Counts prepares in flight across handlers (from any thread): more than one at a time is an overlap."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.in_flight = 0
        self.most = 0
        self.events: list[str] = []

    def enter(self, name: str) -> None:
        with self._lock:
            self.in_flight += 1
            self.most = max(self.most, self.in_flight)
            self.events.append(f"start:{name}")

    def leave(self, name: str) -> None:
        with self._lock:
            self.events.append(f"end:{name}")
            self.in_flight -= 1


class ProbedHandler(ToyHandler):
    """A handler whose prepare stays in flight for a while (or until ``gate`` opens) and reports to a probe."""

    def __init__(self, probe: OverlapProbe, gate: threading.Event | None = None) -> None:
        super().__init__()
        self.probe = probe
        self.gate = gate
        self.entered = threading.Event()

    def prepare_one(self, claim: ClaimRef) -> list[PreparedDevice]:
        self.entered.set()
        self.probe.enter(claim.name)
        try:
            if self.gate is not None:
                assert self.gate.wait(10), "the test never opened the gate"
            for _ in range(5):  # the thread gives way: an unserialized prepare in another thread would start
                time.sleep(0.002)
        finally:
            self.probe.leave(claim.name)
        return super().prepare_one(claim)


async def _entered(handler: ProbedHandler) -> None:
    """Until the handler's prepare has started (in a DRA server thread)."""
    assert await asyncio.to_thread(handler.entered.wait, 10), "the prepare never started"


HOLDER = """
import fcntl, os, sys
fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT, 0o600)
mode = sys.argv[2]
if mode == "hold":
    fcntl.flock(fd, fcntl.LOCK_EX)
    print("held", flush=True)
    sys.stdin.readline()
    open(sys.argv[3], "w").close()  # written while still holding the lock
else:
    for line in sys.stdin:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            print("got", flush=True)
            fcntl.flock(fd, fcntl.LOCK_UN)
        except BlockingIOError:
            print("busy", flush=True)
"""


async def _holder(lock: Path, mode: str, marker: Path | None = None) -> asyncio.subprocess.Process:
    args = [sys.executable, "-c", HOLDER, str(lock), mode] + ([str(marker)] if marker else [])
    return await asyncio.create_subprocess_exec(*args, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE)


async def _ask(proc: asyncio.subprocess.Process) -> str:
    assert proc.stdin is not None and proc.stdout is not None
    proc.stdin.write(b"\n")
    await proc.stdin.drain()
    return (await asyncio.wait_for(proc.stdout.readline(), 10)).decode().strip()


def test_concurrent_prepares_never_overlap(short_tmp: Path) -> None:
    async def scenario() -> None:
        probe = OverlapProbe()
        standin, plugin, _ = await _start(short_tmp, handler=ProbedHandler(probe))
        conn = await standin.register_dra(DRIVER)
        await asyncio.gather(*(conn.prepare(("ns", f"u{i}", f"c{i}")) for i in range(5)))
        assert probe.most == 1, probe.events
        assert len(probe.events) == 10
        assert all(a.split(":")[1] == b.split(":")[1] and a.startswith("start") and b.startswith("end")
                   for a, b in zip(probe.events[::2], probe.events[1::2], strict=True)), probe.events
        await conn.close()
        await plugin.stop()
    asyncio.run(scenario())


def test_a_prepare_waits_while_another_process_holds_the_lock(short_tmp: Path,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    async def scenario() -> None:
        spy = FlockBusySpy()
        monkeypatch.setattr(plugin_module, "fcntl", spy)
        standin, plugin, handler = await _start(short_tmp)
        marker = short_tmp / "released"
        seen_marker: list[bool] = []
        real_prepare = handler.prepare_one

        def prepare(claim: ClaimRef) -> list[PreparedDevice]:
            seen_marker.append(marker.exists())
            return real_prepare(claim)

        handler.prepare_one = prepare  # type: ignore[method-assign]
        other = await _holder(plugin.data_dir / "serialize.lock", "hold", marker)
        assert other.stdout is not None
        assert (await asyncio.wait_for(other.stdout.readline(), 10)).strip() == b"held"
        conn = await standin.register_dra(DRIVER)
        call = asyncio.ensure_future(conn.prepare(("ns", "u1", "c1")))
        await spy.wait_busy(10)  # the plugin tried the lock and found it taken
        assert handler.calls == ["read:c1"] and not call.done(), "read before the locks, nothing done under them"
        assert other.stdin is not None
        other.stdin.write(b"\n")
        await other.stdin.drain()
        await other.wait()
        resp = await asyncio.wait_for(call, 10)
        assert resp["u1"].error == ""  # type: ignore[attr-defined]
        assert seen_marker == [True], "prepare ran before the other process let go of the lock"
        await conn.close()
        await plugin.stop()
    asyncio.run(scenario())


def test_another_process_is_kept_out_while_a_prepare_runs(short_tmp: Path) -> None:
    async def scenario() -> None:
        gate = threading.Event()
        handler = ProbedHandler(OverlapProbe(), gate)
        standin, plugin, _ = await _start(short_tmp, handler=handler)
        other = await _holder(plugin.data_dir / "serialize.lock", "try")
        conn = await standin.register_dra(DRIVER)
        assert await _ask(other) == "got", "nobody holds the lock before the prepare"
        call = asyncio.ensure_future(conn.prepare(("ns", "u1", "c1")))
        await _entered(handler)
        assert await _ask(other) == "busy"
        gate.set()
        await asyncio.wait_for(call, 10)
        assert await _ask(other) == "got", "the lock is released after the call"
        assert other.stdin is not None
        other.stdin.close()
        await other.wait()
        await conn.close()
        await plugin.stop()
    asyncio.run(scenario())


def test_two_plugin_instances_contend_for_the_lock(short_tmp: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Two pods of a rolling update (two pod UIDs, one host): one prepares at a time across both."""
    async def scenario() -> None:
        spy = FlockBusySpy()
        monkeypatch.setattr(plugin_module, "fcntl", spy)
        standin, paths = served_paths(short_tmp)
        probe = OverlapProbe()
        gate = threading.Event()
        old_handler, new_handler = ProbedHandler(probe, gate), ProbedHandler(probe)
        old = DraPlugin(old_handler, paths, claims=old_handler, pod_uid="pod-old")
        new = DraPlugin(new_handler, paths, claims=new_handler, pod_uid="pod-new")
        await old.start()
        await new.start()
        assert old.registration_socket != new.registration_socket and old.dra_socket != new.dra_socket
        first = asyncio.ensure_future(asyncio.to_thread(old.prepare_claims_blocking,
                                                        [ClaimRef("ns", "u-old", "c-old")]))
        await _entered(old_handler)
        second = asyncio.ensure_future(asyncio.to_thread(new.prepare_claims_blocking,
                                                         [ClaimRef("ns", "u-new", "c-new")]))
        await spy.wait_busy(10)  # the new pod met the old pod's lock
        assert not new_handler.entered.is_set()
        gate.set()
        results = await asyncio.wait_for(asyncio.gather(first, second), 10)
        assert [r[uid][1] for r, uid in zip(results, ("u-old", "u-new"), strict=True)] == ["", ""]
        assert probe.most == 1 and probe.events == ["start:c-old", "end:c-old", "start:c-new", "end:c-new"]
        await old.stop()
        await new.stop()
    asyncio.run(scenario())


def test_health_stream_sends_full_list_on_change(short_tmp: Path) -> None:
    async def scenario() -> None:
        standin, plugin, handler = await _start(short_tmp)
        conn = await standin.register_dra(DRIVER)
        stream = conn.watch_health()
        first = await asyncio.wait_for(stream.read(), 2)
        got = [(d.device.device_name, d.health) for d in first.devices]
        assert got == [("toy-0", hp.HEALTHY), ("toy-1", hp.UNKNOWN)]
        handler.healthy = False
        await plugin.health_changed()
        second = await asyncio.wait_for(stream.read(), 2)
        assert second.devices[0].health == hp.UNHEALTHY
        assert len(second.devices) == 2, "each message is the complete list"
        assert len(second.devices[0].message) == 1024 and second.devices[0].message.endswith("...")
        assert second.devices[0].health_check_timeout_seconds == 30
        stream.cancel()
        await conn.close()
        await plugin.stop()
    asyncio.run(scenario())


def test_registration_rejection_is_reported(short_tmp: Path) -> None:
    async def scenario() -> None:
        standin, plugin, _ = await _start(short_tmp)
        plugin.serve_health = False
        # a kubelet that only knows an older API rejects us: the plugin must surface it
        import accel_rig.kubelet_standin as ks
        old = ks.KUBELET_DRA_SERVICES
        ks.KUBELET_DRA_SERVICES = ("v1alpha4.DRAPlugin",)
        try:
            with pytest.raises(RuntimeError, match="rejected"):
                await standin.register_dra(DRIVER)
            ok, error = await asyncio.wait_for(plugin.registration_status.get(), 2)
            assert not ok and "versions" in error
        finally:
            ks.KUBELET_DRA_SERVICES = old
            await plugin.stop()
    asyncio.run(scenario())


def test_a_call_waiting_for_the_other_pods_lock_gives_up_when_the_driver_stops(
        short_tmp: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A stopping driver must not hang on the other pod's lock: the waiting call fails (the kubelet retries it),
    and stop() returns."""
    async def scenario() -> None:
        spy = FlockBusySpy()
        monkeypatch.setattr(plugin_module, "fcntl", spy)
        standin, plugin, handler = await _start(short_tmp)
        other = await _holder(plugin.data_dir / "serialize.lock", "hold", short_tmp / "released")
        assert other.stdout is not None
        assert (await asyncio.wait_for(other.stdout.readline(), 10)).strip() == b"held"
        conn = await standin.register_dra(DRIVER)
        call = asyncio.ensure_future(conn.prepare(("ns", "u1", "c1")))
        await spy.wait_busy(10)
        await asyncio.wait_for(plugin.stop(), 10)
        try:
            resp = await asyncio.wait_for(call, 10)
            assert "stopping" in resp["u1"].error  # type: ignore[attr-defined]
        except grpc.aio.AioRpcError as exc:  # or the server cancelled the call on its way down
            assert exc.code() in (grpc.StatusCode.CANCELLED, grpc.StatusCode.UNAVAILABLE), exc
        assert other.stdin is not None
        other.stdin.write(b"\n")  # the other pod lets go
        await other.stdin.drain()
        await other.wait()
        for _ in range(200):  # take the locks ourselves once nobody holds them (a call still waiting would first)
            try:
                async with plugin.exclusive():
                    break
            except ClaimError:
                await asyncio.sleep(0.025)
        else:
            pytest.fail("the locks stayed taken after the other pod let go")
        assert handler.calls == ["read:c1"], "the stopped driver gave the call up instead of preparing it later"
        await conn.close()
    asyncio.run(scenario())
