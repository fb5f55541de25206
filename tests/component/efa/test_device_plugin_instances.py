"""Issue 25 item 6: a second instance of a device plugin on one node refuses to start instead of deleting the
first one's socket (a per-socket flock in the device-plugins directory)."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

import pytest
from accel_rig.kubelet_standin import KubeletStandIn
from hostcache import copy_host

from accel_core.deviceplugin import AdvertisedDevice, DevicePluginServer
from accel_core.edits import ContainerEdits
from accel_core.instancelock import LOCK_DIR, InstanceConflict, InstanceLock
from efa_plugin import RESOURCE_NAME, SOCKET_NAME

REPO = Path(__file__).resolve().parents[3]


class OnePolicy:
    resource_name = "example.com/one"
    socket_name = "one.sock"

    def devices(self) -> Sequence[AdvertisedDevice]:
        return [AdvertisedDevice("a")]

    def advertise_blocked(self) -> str | None:
        return None

    def preferred(self, available: Sequence[str], must_include: Sequence[str], size: int) -> list[str]:
        return list(available)[:size]

    def allocate(self, ids: Sequence[str]) -> ContainerEdits:
        return ContainerEdits()


def test_second_server_for_a_socket_stops_and_leaves_the_first_alone(short_tmp: Path) -> None:
    async def scenario() -> None:
        standin = KubeletStandIn(short_tmp / "k")
        await standin.start()
        stop_first, stop_second = asyncio.Event(), asyncio.Event()
        first = DevicePluginServer(OnePolicy(), standin.paths(), retry_interval=0.1)
        first_task = first.start(stop_first)
        try:
            await standin.wait_registered("example.com/one")
            socket_id = os.stat(first.socket_path).st_ino
            second = DevicePluginServer(OnePolicy(), standin.paths(), retry_interval=0.1)
            with pytest.raises(InstanceConflict, match=f"pid {os.getpid()}"):
                await asyncio.wait_for(second.run(stop_second), 10)
            assert os.stat(first.socket_path).st_ino == socket_id, "the first server's socket was not touched"
            await standin.restart()  # the kubelet deletes files, not the lock directory
            await standin.wait_registered("example.com/one", count=2)
            assert (standin.dp_dir / LOCK_DIR / "one.sock.lock").is_file()
            with pytest.raises(InstanceConflict):
                await asyncio.wait_for(DevicePluginServer(OnePolicy(), standin.paths()).run(asyncio.Event()), 10)
            assert standin.registrations.count("example.com/one") == 2
            stop_first.set()
            await asyncio.wait_for(first_task, 10)
            # released on exit: the next one takes over
            third, stop_third = DevicePluginServer(OnePolicy(), standin.paths(), retry_interval=0.1), asyncio.Event()
            third_task = third.start(stop_third)
            await standin.wait_registered("example.com/one", count=3)
            stop_third.set()
            await asyncio.wait_for(third_task, 10)
        finally:
            stop_first.set()
            await standin.stop()
    asyncio.run(scenario())


def test_a_replaced_lock_file_is_taken_again(short_tmp: Path) -> None:
    """Someone removes the lock file while it is held: the holder re-takes the new file, so a second process that
    created it cannot hold "the" lock alongside."""
    lock = InstanceLock.for_device_plugin(short_tmp, "x.sock")
    lock.acquire()
    lock.path.unlink()
    lock.acquire()
    assert lock.path.read_text() == f"{os.getpid()}\n"
    with pytest.raises(InstanceConflict):
        InstanceLock.for_device_plugin(short_tmp, "x.sock").acquire()
    lock.release()
    InstanceLock.for_device_plugin(short_tmp, "x.sock").acquire()


def _serve(host: Path, standin: KubeletStandIn) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-m", "efa_plugin.cli", "serve", "--host-root", str(host), *standin.daemon_flags(),
         "--metrics-port", "0"],
        env={**os.environ, "PYTHONPATH": str(REPO)}, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def test_second_efa_process_exits_2_naming_the_first_and_a_dead_holder_does_not_block(short_tmp: Path) -> None:
    async def scenario() -> None:
        host = copy_host(short_tmp / "h", "p4d.24xlarge")
        standin = KubeletStandIn(short_tmp / "k")
        await standin.start()
        procs = [_serve(host.root, standin)]
        try:
            await standin.wait_registered(RESOURCE_NAME, timeout=30)
            procs.append(_serve(host.root, standin))
            code = await asyncio.to_thread(procs[1].wait, 30)
            err = procs[1].stderr.read().decode() if procs[1].stderr else ""
            assert code == 2, err
            assert f"pid {procs[0].pid}" in err and "Traceback" not in err, err
            assert (standin.dp_dir / SOCKET_NAME).exists()
            assert standin.registrations.count(RESOURCE_NAME) == 1, "the first one never had to register again"
            procs[0].send_signal(signal.SIGKILL)  # no clean-up at all: its lock file stays, its flock goes
            await asyncio.to_thread(procs[0].wait, 10)
            assert (standin.dp_dir / LOCK_DIR / f"{SOCKET_NAME}.lock").read_text() == f"{procs[0].pid}\n"
            procs.append(_serve(host.root, standin))
            await standin.wait_registered(RESOURCE_NAME, count=2, timeout=30)
            procs[2].send_signal(signal.SIGTERM)
            assert await asyncio.to_thread(procs[2].wait, 20) == 0
        finally:
            for proc in procs:
                if proc.poll() is None:
                    proc.kill()
                    proc.wait()
            await standin.stop()
    asyncio.run(scenario())
