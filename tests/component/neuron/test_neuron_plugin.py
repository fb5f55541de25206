"""The Neuron device plugin against the kubelet stand-in (device plugins + PodResources), over real unix sockets."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shutil
import signal
import socket
import sys
import urllib.request
from collections.abc import AsyncIterator, Callable, Coroutine
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pytest
from accel_rig.kubelet_standin import KubeletStandIn, socket_files
from accel_rig.polling import until
from hostcache import copy_host

from accel_core.fakehost import FakeHost
from accel_core.kubeletapi import deviceplugin_v1beta1_pb2 as dp
from accel_core.kubeletapi import podresources_v1_pb2 as pr
from accel_core.paths import HostPaths
from neuron_dra.deviceplugin.options import ServeOptions
from neuron_dra.deviceplugin.start import service

NEURON = "aws.amazon.com/neuron"
CORE = "aws.amazon.com/neuroncore"
REPO = Path(__file__).resolve().parents[3]


@dataclass
class Running:
    standin: KubeletStandIn
    fake: FakeHost
    paths: HostPaths


def run(coro: Coroutine[Any, Any, None]) -> None:
    asyncio.run(coro)


@contextlib.asynccontextmanager
async def running(short_tmp: Path, itype: str, lnc: int | None = None,
                  pods: list[pr.PodResources] | None = None) -> AsyncIterator[Running]:
    fake = copy_host(short_tmp / "host", itype, lnc=lnc)
    standin = KubeletStandIn(short_tmp / "kubelet")
    standin.pod_resources = list(pods or [])
    await standin.start(pod_resources=True)
    paths = standin.paths(host_root=fake.root)
    options = ServeOptions(rescan_interval=0.2, pod_resources_interval=0.1, pod_resources_idle_interval=0.1,
                           retry_interval=0.2)
    stop = asyncio.Event()
    task = asyncio.create_task(service(paths, options).run(stop))  # as the CLI runs it
    try:
        yield Running(standin, fake, paths)
    finally:
        stop.set()
        await asyncio.wait_for(task, 10)
        await standin.stop()


def unhealthy(devices: list[dp.Device]) -> set[str]:
    return {d.ID for d in devices if d.health != "Healthy"}


def health_is(expected: set[str], count: int) -> Callable[[list[dp.Device]], bool]:
    return lambda devs: len(devs) == count and unhealthy(devs) == expected


def pod(name: str, resource: str, ids: list[str]) -> pr.PodResources:
    return pr.PodResources(name=name, namespace="default", containers=[pr.ContainerResources(
        name="main", devices=[pr.ContainerDevices(resource_name=resource, device_ids=ids)])])


def test_two_registrations_and_allocate(short_tmp: Path) -> None:
    async def scenario() -> None:
        async with running(short_tmp, "trn1.32xlarge") as r:
            neuron = await r.standin.wait_registered(NEURON)
            core = await r.standin.wait_registered(CORE)
            assert neuron.endpoint.name == "neuron-devplugin.sock"
            assert core.endpoint.name == "neuroncore-devplugin.sock"
            assert neuron.options.get_preferred_allocation_available
            devs = await r.standin.wait_devices(NEURON, lambda d: len(d) == 16)
            assert [d.ID for d in devs] == [str(i) for i in range(16)]
            assert [n.ID for n in devs[2].topology.nodes] == [1]
            await r.standin.wait_devices(CORE, lambda d: len(d) == 32 and not unhealthy(d))
            assert set(socket_files(r.standin.dp_dir)) >= {"neuron-devplugin.sock", "neuroncore-devplugin.sock"}

            # connected set: one torus row
            assert await r.standin.preferred(NEURON, [str(i) for i in range(16)], [], 4) == ["0", "1", "2", "3"]
            # two containers of one pod, each its own set
            resp = await r.standin.allocate(NEURON, ["0", "1"], ["2"])
            first, second = resp.container_responses
            assert [(d.host_path, d.container_path, d.permissions) for d in first.devices] == [
                ("/dev/neuron0", "/dev/neuron0", "rw"), ("/dev/neuron1", "/dev/neuron1", "rw")]
            assert dict(first.envs) == {"NEURON_RT_VISIBLE_CORES": "0-3"}
            assert [d.host_path for d in second.devices] == ["/dev/neuron2"]
            assert dict(second.envs) == {"NEURON_RT_VISIBLE_CORES": "0-1"}
            # cores on devices 4 and 5: whole /dev nodes, container-relative cores
            resp = await r.standin.allocate(CORE, ["9", "10"])
            (c,) = resp.container_responses
            assert [d.host_path for d in c.devices] == ["/dev/neuron4", "/dev/neuron5"]
            assert dict(c.envs) == {"NEURON_RT_VISIBLE_CORES": "1-2"}
    run(scenario())


def test_lnc_env_on_trn2(short_tmp: Path) -> None:
    async def scenario() -> None:
        async with running(short_tmp, "trn2.3xlarge", lnc=1) as r:
            await r.standin.wait_registered(CORE)
            await r.standin.wait_devices(CORE, lambda d: len(d) == 8)
            resp = await r.standin.allocate(CORE, ["6", "7"])
            assert dict(resp.container_responses[0].envs) == {"NEURON_RT_VISIBLE_CORES": "6-7",
                                                              "NEURON_LOGICAL_NC_CONFIG": "1"}
    run(scenario())


def test_no_double_counting_both_ways(short_tmp: Path) -> None:
    async def scenario() -> None:
        async with running(short_tmp, "trn1.32xlarge") as r:
            await r.standin.wait_registered(NEURON)
            await r.standin.wait_registered(CORE)
            await r.standin.wait_devices(CORE, health_is(set(), 32))

            # neuron -> neuroncore: device 3 allocated, its cores 6 and 7 go Unhealthy at once
            await r.standin.allocate(NEURON, ["3"])
            await r.standin.wait_devices(CORE, health_is({"6", "7"}, 32))
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await r.standin.allocate(CORE, ["6"])
            assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            r.standin.pod_resources = [pod("uses-neuron", NEURON, ["3"])]
            polls = r.standin.pod_resources_calls
            await until(lambda: r.standin.pod_resources_calls >= polls + 2, "two PodResources polls")  # still in use
            assert unhealthy(r.standin.plugins[CORE].devices) == {"6", "7"}
            r.standin.pod_resources = []  # the pod is gone
            await r.standin.wait_devices(CORE, health_is(set(), 32))

            # neuroncore -> neuron: cores held by a pod (learned from PodResources alone) block device 5
            r.standin.pod_resources = [pod("uses-cores", CORE, ["10"])]
            await r.standin.wait_devices(NEURON, health_is({"5"}, 16))
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await r.standin.allocate(NEURON, ["5"])
            assert "unhealthy" in (err.value.details() or "")
            assert "5" not in await r.standin.preferred(NEURON, [str(i) for i in range(16)], [], 8)
            r.standin.pod_resources = []
            await r.standin.wait_devices(NEURON, health_is(set(), 16))
            assert r.standin.pod_resources_calls > 3
    run(scenario())


def test_restart_learns_usage_before_advertising(short_tmp: Path) -> None:
    async def scenario() -> None:
        async with running(short_tmp, "trn1.32xlarge", pods=[pod("old", CORE, ["10", "11"])]) as r:
            neuron = await r.standin.wait_registered(NEURON)
            await r.standin.wait_devices(NEURON, lambda d: len(d) == 16)
            assert unhealthy(neuron.devices) == {"5"} and neuron.updates == 1  # right from the first list
    run(scenario())


def test_node_without_neuron_keeps_running(short_tmp: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="accel_core.deviceplugin.pluginserver")

    async def scenario() -> None:
        async with running(short_tmp, "c5.large") as r:
            await until(lambda: sum("no devices to advertise" in m.getMessage() for m in caplog.records) >= 2,
                        "both servers deciding there is nothing to advertise")
            assert r.standin.registrations == []
            assert not set(socket_files(r.standin.dp_dir)) & {"neuron-devplugin.sock", "neuroncore-devplugin.sock"}
    run(scenario())


def test_coexistence_guard(short_tmp: Path) -> None:
    async def scenario() -> None:
        async with running(short_tmp, "inf2.48xlarge") as r:
            await r.standin.wait_registered(NEURON)
            await r.standin.wait_devices(NEURON, lambda d: len(d) == 12)
            reg = r.standin.registry_dir / "neuron.aws.com-reg.sock"
            with socket.socket(socket.AF_UNIX) as sock:  # a real unix socket, as the DRA driver leaves it
                sock.bind(str(reg))
                await r.standin.wait_devices(NEURON, lambda d: d == [])
                await r.standin.wait_devices(CORE, lambda d: d == [])
            reg.unlink()
            await r.standin.wait_devices(NEURON, lambda d: len(d) == 12)
            await r.standin.wait_devices(CORE, lambda d: len(d) == 24)
            # a rolling update's socket counts too
            with socket.socket(socket.AF_UNIX) as sock:
                sock.bind(str(r.standin.registry_dir / "neuron.aws.com-42-reg.sock"))
                await r.standin.wait_devices(NEURON, lambda d: d == [])
            (r.standin.registry_dir / "neuron.aws.com-42-reg.sock").unlink()
            await r.standin.wait_devices(NEURON, lambda d: len(d) == 12)
    run(scenario())


def test_health_both_ways(short_tmp: Path) -> None:
    async def scenario() -> None:
        async with running(short_tmp, "inf2.24xlarge") as r:
            await r.standin.wait_registered(NEURON)
            await r.standin.wait_registered(CORE)
            await r.standin.wait_devices(NEURON, health_is(set(), 6))
            r.fake.remove_neuron(2)
            await r.standin.wait_devices(NEURON, health_is({"2"}, 6))
            await r.standin.wait_devices(CORE, health_is({"4", "5"}, 12))
            r.fake.restore_neuron(2)
            await r.standin.wait_devices(NEURON, health_is(set(), 6))
            await r.standin.wait_devices(CORE, health_is(set(), 12))
            r.fake.remove_dev_node("/dev/neuron0")
            await r.standin.wait_devices(NEURON, health_is({"0"}, 6))
            r.fake.restore_dev_node("/dev/neuron0")
            await r.standin.wait_devices(NEURON, health_is(set(), 6))
            r.fake.set_neuron_counter(4, "stats/hardware/sram_ecc_uncorrected/total", 1)
            await r.standin.wait_devices(NEURON, health_is({"4"}, 6))
            await r.standin.wait_devices(CORE, health_is({"8", "9"}, 12))
            r.fake.set_neuron_counter(4, "stats/hardware/sram_ecc_uncorrected/total", 0)
            await r.standin.wait_devices(NEURON, health_is(set(), 6))
    run(scenario())


def test_kubelet_restart_re_registers_both(short_tmp: Path) -> None:
    async def scenario() -> None:
        async with running(short_tmp, "trn1.2xlarge") as r:
            await r.standin.wait_registered(NEURON)
            await r.standin.wait_registered(CORE)
            await r.standin.restart()
            await r.standin.wait_registered(NEURON, count=2)
            await r.standin.wait_registered(CORE, count=2)
            await r.standin.wait_devices(CORE, lambda d: len(d) == 2)
    run(scenario())


def _command() -> list[str]:
    script = shutil.which("neuron-device-plugin", path=str(Path(sys.executable).parent))
    return [script] if script else [sys.executable, "-m", "neuron_dra.deviceplugin.cli"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_serve_subprocess_sigterm(short_tmp: Path) -> None:
    async def scenario() -> None:
        fake = copy_host(short_tmp / "host", "inf2.xlarge")
        fake.set_neuron_counter(0, "stats/hardware/mem_ecc_uncorrected/total", 0)
        standin = KubeletStandIn(short_tmp / "kubelet")
        await standin.start(pod_resources=True)
        port = _free_port()
        env = {**os.environ, "PYTHONPATH": str(REPO)}
        proc = await asyncio.create_subprocess_exec(
            *_command(), "serve", "--host-root", str(fake.root), *standin.daemon_flags(),
            "--metrics-port", str(port), "--metrics-address", "127.0.0.1", "--log-format", "json",
            env=env, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
        try:
            await standin.wait_registered(NEURON, timeout=30)
            await standin.wait_registered(CORE, timeout=30)
            await standin.wait_devices(CORE, lambda d: len(d) == 2, timeout=10)
            body = await asyncio.to_thread(
                lambda: urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode())
            assert 'neurondevice_hw_ecc_events_total{event_type="mem_ecc_uncorrected",neuron_device_index="0"}' \
                in body
            assert 'accel_device_plugin_registered{resource="aws.amazon.com/neuroncore"} 1.0' in body
            proc.send_signal(signal.SIGTERM)
            code = await asyncio.wait_for(proc.wait(), 15)
            _, err = await proc.communicate()
            assert code == 0, err.decode()[-2000:]
            assert not set(socket_files(standin.dp_dir)) & {"neuron-devplugin.sock", "neuroncore-devplugin.sock"}
            assert b'"msg": "stopping"' in err and b"Traceback" not in err
        finally:
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
            await standin.stop()
    run(scenario())
