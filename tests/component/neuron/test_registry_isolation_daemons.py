"""Issue 33 items 4-5, as real processes: a third-party accelerator package installed on the node (a dist-info with
its entry point, on PYTHONPATH as pip would put it) never takes the Neuron daemons down unless it collides with
their own declaration, and then each start is exit 2 and one line, 20 times out of 20. Before, the device plugin
registered, then died on its first scan (a traceback; SIGSEGV with no line in some starts: the event loop closed
under gRPC's threads).

Facts used: trn1.32xlarge has 16 Neuron devices (AWS); the Neuron device plugin's metrics port is 9811 and the DRA
driver's 9812 (neuron_dra/accelerator.py, the charts' values)."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from collections.abc import Sequence
from pathlib import Path

import pytest
from accel_pkgs import write_package
from accel_rig.kubelet_standin import KubeletStandIn
from hostcache import copy_host

REPO = Path(__file__).resolve().parents[3]
STARTS = 20
DECLARE = "from accel_core.registry import Accelerator, Daemon\n"

#: unrelated to Neuron: each must be one warning line, and the daemon serves as if it were not there
UNRELATED = {
    "imperr": "import no_such_module_for_the_test\n",
    "sysexit": "import sys\nsys.exit(0)\n",
    "baseexc": "raise BaseException('at import')\n",
    "wrongtype": "ACCELERATOR = 42\n",
    # claims EFA's name and catalog section (it replaced ours before, and Neuron's scan then died of AttributeError)
    "efaclone": DECLARE + "ACCELERATOR = Accelerator('efa', ('efaclone_accel',), "
                          "catalog_sections={'efa': 'efaclone_accel:S'})\n"
                          "import msgspec\nclass S(msgspec.Struct):\n    x: int = 0\n",
}


def _env(pkgs: Path) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": f"{pkgs}:{REPO}"}


async def _run(argv: Sequence[str], pkgs: Path, timeout: float = 60) -> tuple[int, list[str]]:
    proc = await asyncio.create_subprocess_exec(*argv, env=_env(pkgs), stdout=asyncio.subprocess.DEVNULL,
                                                stderr=asyncio.subprocess.PIPE)
    try:
        _, err = await asyncio.wait_for(proc.communicate(), timeout)
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    assert proc.returncode is not None
    return proc.returncode, err.decode().splitlines()


def _plugin(host: Path, standin: KubeletStandIn) -> list[str]:
    return [sys.executable, "-m", "neuron_dra.deviceplugin.cli", "serve", "--host-root", str(host),
            *standin.daemon_flags(), "--metrics-port", "0"]


@pytest.mark.parametrize(("body", "claim"), [
    ("ACCELERATOR = Accelerator('nx', ('neuronish_accel',), catalog_sections={'neuron': 'x:S'})",
     "catalog section 'neuron'"),
    ("ACCELERATOR = Accelerator('nx', ('neuronish_accel',), (Daemon('nx-plugin', 'x:main', 9811),))", "port 9811"),
])
def test_a_collision_with_neurons_own_is_exit_2_and_one_line_every_start(body: str, claim: str,
                                                                        short_tmp: Path) -> None:
    pkgs = write_package(short_tmp / "pkgs", "neuronish", DECLARE + body + "\n")
    host = copy_host(short_tmp / "h", "trn1.32xlarge")

    async def scenario() -> list[tuple[int, list[str]]]:
        standin = KubeletStandIn(short_tmp / "k")
        await standin.start()
        try:
            return [await _run(_plugin(host.root, standin), pkgs) for _ in range(STARTS)]
        finally:
            await standin.stop()

    results = asyncio.run(scenario())
    for code, lines in results:
        assert code == 2, lines
        (line,) = lines
        assert "level=ERROR" in line and claim in line and "neuronish-accel" in line, line
    assert len(results) == STARTS


def test_a_collision_with_the_neuron_dra_drivers_own_port_is_exit_2_and_one_line(short_tmp: Path) -> None:
    pkgs = write_package(short_tmp / "pkgs", "neuronish", DECLARE + "ACCELERATOR = Accelerator('nx', "
                         "('neuronish_accel',), (Daemon('nx-driver', 'x:main', 9900, health_port=9812),))\n")
    code, lines = asyncio.run(_run([sys.executable, "-m", "neuron_dra.dra.cli", "serve", "--node-name", "n1",
                                    "--host-root", str(short_tmp), "--kubelet-root", str(short_tmp / "k")], pkgs))
    assert code == 2, lines
    (line,) = lines
    assert "level=ERROR" in line and "port 9812 is claimed by both neuron/neuron-dra-driver" in line, line


def test_unrelated_broken_packages_are_one_line_each_and_neuron_serves(short_tmp: Path) -> None:
    pkgs = short_tmp / "pkgs"
    for name, body in UNRELATED.items():
        write_package(pkgs, name, body)
    host = copy_host(short_tmp / "h", "trn1.32xlarge")

    async def scenario() -> tuple[int, list[str], int]:
        standin = KubeletStandIn(short_tmp / "k")
        await standin.start()
        proc = await asyncio.create_subprocess_exec(*_plugin(host.root, standin), env=_env(pkgs),
                                                    stdout=asyncio.subprocess.DEVNULL,
                                                    stderr=asyncio.subprocess.PIPE)
        try:
            await standin.wait_registered("aws.amazon.com/neuron", timeout=60)
            devices = await standin.wait_devices("aws.amazon.com/neuron", lambda d: len(d) > 0, timeout=60)
            proc.send_signal(signal.SIGTERM)
            _, err = await asyncio.wait_for(proc.communicate(), 30)
            assert proc.returncode is not None
            return proc.returncode, err.decode().splitlines(), len(devices)
        finally:
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
            await standin.stop()

    code, lines, devices = asyncio.run(scenario())
    assert code == 0 and devices == 16, lines
    assert not [line for line in lines if "level=ERROR" in line or "Traceback" in line], lines
    warnings = [line for line in lines if "logger=accel_core.registry" in line]
    assert len(warnings) == len(UNRELATED), warnings
    for name in UNRELATED:
        assert len([w for w in warnings if f"{name}-accel" in w]) == 1, (name, warnings)


# A daemon body that fails after it has registered (its servers and the kubelet's ListAndWatch streams are up)
FAIL_AFTER_REGISTER = """
import sys
import neuron_dra.deviceplugin.daemon as body

class NeuronPlugin:
    def __init__(self, *args, **kwargs):
        raise RuntimeError("the daemon body failed after registering")

body.NeuronPlugin = NeuronPlugin
from neuron_dra.deviceplugin.cli import CLI
sys.exit(CLI.main(sys.argv[1:]))
"""


def test_a_daemon_failing_with_grpc_serving_stops_it_first_every_time(short_tmp: Path) -> None:
    host = copy_host(short_tmp / "h", "trn1.32xlarge")

    async def scenario() -> list[tuple[int, list[str]]]:
        standin = KubeletStandIn(short_tmp / "k")
        await standin.start()
        try:
            argv = [sys.executable, "-c", FAIL_AFTER_REGISTER, *_plugin(host.root, standin)[3:]]
            return [await _run(argv, short_tmp) for _ in range(STARTS)]
        finally:
            await standin.stop()

    results = asyncio.run(scenario())
    assert [code for code, _ in results] == [1] * STARTS, [(c, lines[-3:]) for c, lines in results if c != 1]
    for _, lines in results:
        assert lines[-1] == "RuntimeError: the daemon body failed after registering", lines[-5:]
        assert any('msg="registered with kubelet"' in line for line in lines), lines
