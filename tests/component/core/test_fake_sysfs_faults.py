"""The ``fake-sysfs`` fault verbs reach running daemons: the EFA and Neuron device plugins run as processes (their
console scripts) against one fake trn2.48xlarge tree and the kubelet stand-in, and each verb, run as its own
process the way a user types it, shows in ListAndWatch: port down -> that EFA Unhealthy, up -> Healthy; a Neuron
uncorrected error -> Unhealthy until cleared; a removed device -> Unhealthy and still listed, restored -> Healthy."""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import sys
from collections.abc import AsyncIterator, Callable
from pathlib import Path

from accel_rig.kubelet_standin import KubeletStandIn
from hostcache import copy_host

from accel_core.awsfacts import catalog
from accel_core.kubeletapi import deviceplugin_v1beta1_pb2 as dp

REPO = Path(__file__).resolve().parents[3]
EFA = "vpc.amazonaws.com/efa"
NEURON = "aws.amazon.com/neuron"
TYPE = "trn2.48xlarge"


def _script(name: str, module: str) -> list[str]:
    found = shutil.which(name, path=str(Path(sys.executable).parent))
    return [found] if found else [sys.executable, "-m", module]


async def fake_sysfs(*args: str) -> str:
    """Run a verb as its own process; it must succeed. Returns its stdout."""
    proc = await asyncio.create_subprocess_exec(
        *_script("fake-sysfs", "accel_core.fakehost.cli"), *args, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE, env={**os.environ, "PYTHONPATH": str(REPO)})
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode == 0, err.decode()
    return out.decode()


@contextlib.asynccontextmanager
async def daemon(argv: list[str], log: Path) -> AsyncIterator[None]:
    with log.open("wb") as fh:
        proc = await asyncio.create_subprocess_exec(*argv, stdout=fh, stderr=fh,
                                                    env={**os.environ, "PYTHONPATH": str(REPO)})
    try:
        yield
    finally:
        if proc.returncode is None:
            proc.send_signal(signal.SIGTERM)
            try:
                await asyncio.wait_for(proc.wait(), 15)
            except TimeoutError:
                proc.kill()
                await proc.wait()


def unhealthy_is(expected: set[str], count: int) -> Callable[[list[dp.Device]], bool]:
    return lambda devs: len(devs) == count and {d.ID for d in devs if d.health != "Healthy"} == expected


def test_fault_verbs_reach_both_device_plugins(short_tmp: Path) -> None:
    spec = catalog.get(TYPE)
    assert spec.efa is not None
    bdf = {d.ibdev: d.pci.bdf for d in spec.efa.devices}  # the EFA plugin's device IDs are the PCI addresses
    ib, other_ib = spec.efa.devices[0].ibdev, spec.efa.devices[5].ibdev

    async def scenario() -> None:
        host = copy_host(short_tmp / "h", TYPE)
        root = str(host.root)
        standin = KubeletStandIn(short_tmp / "k")
        await standin.start(pod_resources=True)
        common = ["serve", "--host-root", root, *standin.daemon_flags(), "--metrics-port", "0"]
        try:
            async with daemon([*_script("efa-device-plugin", "efa_plugin.cli"), *common], short_tmp / "efa.log"), \
                    daemon([*_script("neuron-device-plugin", "neuron_dra.deviceplugin.cli"), *common],
                           short_tmp / "neuron.log"):
                await standin.wait_devices(EFA, unhealthy_is(set(), 16), timeout=60)
                await standin.wait_devices(NEURON, unhealthy_is(set(), 16), timeout=60)

                assert (await fake_sysfs("port", root, ib, "down")) == f"{ib} port 1: ACTIVE -> DOWN\n"
                await standin.wait_devices(EFA, unhealthy_is({bdf[ib]}, 16), timeout=10)
                await fake_sysfs("port", root, ib, "up")
                await standin.wait_devices(EFA, unhealthy_is(set(), 16), timeout=10)

                await fake_sysfs("neuron-error", root, "neuron3")
                await standin.wait_devices(NEURON, unhealthy_is({"3"}, 16), timeout=10)
                await fake_sysfs("neuron-error", root, "neuron3", "--counter", "sram_ecc_uncorrected", "--count", "2")
                await fake_sysfs("neuron-error", root, "neuron3", "--clear")
                await standin.wait_devices(NEURON, unhealthy_is(set(), 16), timeout=10)

                await fake_sysfs("remove", root, "neuron5")
                await standin.wait_devices(NEURON, unhealthy_is({"5"}, 16), timeout=10)
                await fake_sysfs("remove", root, other_ib)
                await standin.wait_devices(EFA, unhealthy_is({bdf[other_ib]}, 16), timeout=10)
                await fake_sysfs("restore", root, "neuron5")
                await fake_sysfs("restore", root, other_ib)
                await standin.wait_devices(NEURON, unhealthy_is(set(), 16), timeout=10)
                await standin.wait_devices(EFA, unhealthy_is(set(), 16), timeout=10)

                await fake_sysfs("remove", root, "neuron0", "--dev-node")
                await standin.wait_devices(NEURON, unhealthy_is({"0"}, 16), timeout=10)
                await fake_sysfs("restore", root, "neuron0")
                await standin.wait_devices(NEURON, unhealthy_is(set(), 16), timeout=10)
        finally:
            await standin.stop()

    asyncio.run(scenario())
