"""The generic DRA plugin against the kubelet stand-in's registration handshake and DRA calls, over unix sockets."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from accel_core.devtools.kubelet_standin import KubeletStandIn, socket_files
from accel_core.dra.plugin import DraPlugin
from accel_core.dra.types import ClaimError, ClaimRef, DeviceHealthReport, PreparedDevice
from accel_core.kubeletapi import dra_health_v1alpha1_pb2 as hp

DRIVER = "toy.example.com"


class ToyHandler:
    driver_name = DRIVER

    def __init__(self) -> None:
        self.prepared: dict[str, list[PreparedDevice]] = {}
        self.calls: list[str] = []
        self.healthy = True

    async def prepare(self, claim: ClaimRef) -> list[PreparedDevice]:
        self.calls.append(f"prepare:{claim.name}")
        if claim.name == "bad":
            raise ClaimError("opaque config: unknown field 'colour'")
        if claim.name == "boom":
            raise RuntimeError("driver bug")
        await asyncio.sleep(0.01)  # overlap would show in calls order if calls were not serialized
        devs = [PreparedDevice("node-a", "toy-0", (f"k8s.toy/claim={claim.uid}-toy-0",), ("req",), "s1")]
        self.prepared[claim.uid] = devs
        return devs

    async def unprepare(self, claim: ClaimRef) -> None:
        self.calls.append(f"unprepare:{claim.name}")
        self.prepared.pop(claim.uid, None)

    def health(self) -> list[DeviceHealthReport] | None:
        return [DeviceHealthReport("node-a", "toy-0", self.healthy, "" if self.healthy else "x" * 2000, 30),
                DeviceHealthReport("node-a", "toy-1", None)]


async def _start(short_tmp: Path, pod_uid: str | None = "pod-123") -> tuple[KubeletStandIn, DraPlugin, ToyHandler]:
    standin = KubeletStandIn(short_tmp / "kubelet")
    standin.registry_dir.mkdir(parents=True)
    handler = ToyHandler()
    plugin = DraPlugin(handler, standin.paths(), pod_uid=pod_uid)
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


def test_concurrent_prepares_are_serialized(short_tmp: Path) -> None:
    async def scenario() -> None:
        standin, plugin, handler = await _start(short_tmp)
        conn = await standin.register_dra(DRIVER)
        await asyncio.gather(*(conn.prepare(("ns", f"u{i}", f"c{i}")) for i in range(5)))
        assert sorted(handler.calls) == [f"prepare:c{i}" for i in range(5)]
        assert (plugin.data_dir / "serialize.lock").exists(), "rolling-update mode serializes through a file lock"
        await conn.close()
        await plugin.stop()
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
        import accel_core.devtools.kubelet_standin as ks
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
