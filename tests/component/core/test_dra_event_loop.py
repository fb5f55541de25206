"""The DRA service never blocks its event loop (issue 14 item 10): while another instance of the driver (the old
pod of a rolling update) holds the serialize lock, the liveness probe, registration and the health stream keep
answering; the waiting prepare goes through as soon as the lock is free."""

from __future__ import annotations

import asyncio
import fcntl
import os
import threading
import time
from pathlib import Path
from typing import Any

import grpc
import pytest
from drarig import DictClaims, claim, served_paths
from hostcache import copy_host
from lockspy import FlockBusySpy

import accel_core.dra.pluginserver as plugin_module
from accel_core.dra.daemon import DraService, ServiceSettings
from accel_core.dra.liveness import SERVING, HealthCheckRequest, HealthCheckResponse
from efa_plugin.dra.profile import EfaProfile
from neuron_dra.dra.profile import NeuronProfile

NODE = "node-a"
#: (profile, fake host, a device of it): the core behaves the same for every driver.
DRIVERS = {
    "neuron.aws.com": (NeuronProfile, "inf2.xlarge", "neuron-device-0"),
    "efa.aws.com": (EfaProfile, "p4d.24xlarge", "efa-0000-10-1b-0"),
}


async def liveness(port: int) -> tuple[int, float]:
    start = time.perf_counter()
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        call = channel.unary_unary("/grpc.health.v1.Health/Check",
                                   request_serializer=HealthCheckRequest.SerializeToString,
                                   response_deserializer=HealthCheckResponse.FromString)
        resp = await call(HealthCheckRequest(service="liveness"), timeout=3)
    return int(resp.status), time.perf_counter() - start


class OtherInstance:
    """Holds the serialize lock from another thread until released (or 5 s), as another process would."""

    def __init__(self, path: Path) -> None:
        self._release = threading.Event()
        held = threading.Event()

        def hold() -> None:
            fd = os.open(path, os.O_RDWR | os.O_CREAT)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX)
                held.set()
                self._release.wait(5)
                fcntl.flock(fd, fcntl.LOCK_UN)
            finally:
                os.close(fd)

        self._thread = threading.Thread(target=hold, daemon=True)
        self._thread.start()
        assert held.wait(5)

    def release(self) -> None:
        self._release.set()
        self._thread.join(10)


@pytest.mark.parametrize("driver", sorted(DRIVERS))
def test_liveness_and_health_answer_while_another_instance_holds_the_lock(short_tmp: Path, driver: str,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    profile, instance_type, device = DRIVERS[driver]
    standin, paths = served_paths(short_tmp, copy_host(short_tmp / "h", instance_type).root)

    spy = FlockBusySpy()
    monkeypatch.setattr(plugin_module, "fcntl", spy)

    async def scenario() -> None:
        claims = DictClaims()
        claims.add(claim("c", [device], driver=driver, uid="u-1"))
        service = DraService(profile(), paths, ServiceSettings(node_name=NODE, pod_uid="new-pod", healthcheck_port=0,
                                                               rescan_interval=0.2, health_refresh_seconds=0.3),
                             claims=claims)
        stop = asyncio.Event()
        task = asyncio.create_task(service.run(stop))
        await asyncio.wait_for(service.ready.wait(), 10)
        assert service.liveness is not None and service.liveness.port
        # the other pod of the rolling update is in the middle of a prepare: it holds the lock (for 5 s at most, so
        # a driver that blocks its loop on the lock fails this test instead of hanging it)
        other = OtherInstance(service.plugin.data_dir / "serialize.lock")
        try:
            conn = await standin.register_dra(driver)  # registration answers
            prepare = asyncio.create_task(conn.prepare(("ns", "u-1", "c")))
            await spy.wait_busy(5)  # the prepare found the lock taken and waits
            start = time.perf_counter()
            await asyncio.sleep(0.05)
            lag = time.perf_counter() - start - 0.05
            assert lag < 0.5, f"the event loop stood still for {lag:.1f}s while the lock was held"
            assert not prepare.done(), "the prepare waits for the lock"
            status, seconds = await liveness(service.liveness.port)
            assert status == SERVING and seconds < 1.0, f"liveness took {seconds:.2f}s while the lock was held"
            stream = conn.watch_health()
            first = await asyncio.wait_for(stream.read(), 2)
            assert device in [d.device.device_name for d in first.devices]
            await asyncio.wait_for(stream.read(), 2)  # the periodic refresh still flows
            stream.cancel()
        finally:
            other.release()
        result: Any = await asyncio.wait_for(prepare, 5)
        assert result["u-1"].error == "" and [d.device_name for d in result["u-1"].devices] == [device]
        await conn.close()
        stop.set()
        await asyncio.wait_for(task, 10)

    asyncio.run(scenario())
