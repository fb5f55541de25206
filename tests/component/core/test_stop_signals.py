"""Issue 25 item 7: SIGHUP stops every daemon cleanly like SIGTERM, and a stop signal at once after start (before
the event loop runs) leaves no socket and a clean exit."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from accel_rig.kubelet_standin import KubeletStandIn
from hostcache import copy_host

REPO = Path(__file__).resolve().parents[3]
DAEMONS = {
    "efa-device-plugin": (["efa_plugin.cli", "serve"], "p4d.24xlarge"),
    "neuron-device-plugin": (["neuron_dra.deviceplugin.cli", "serve"], "trn1.32xlarge"),
    "neuron-dra-driver": (["neuron_dra.dra.cli", "serve", "--node-name", "n1", "--healthcheck-port", "-1"],
                          "trn1.32xlarge"),
    "efa-dra-driver": (["efa_plugin.dra.cli", "serve", "--node-name", "n1", "--healthcheck-port", "-1"],
                       "p4d.24xlarge"),
}
EARLY_LINE = "running; SIGTERM, SIGINT and SIGHUP stop it cleanly"


def sockets(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_socket() and p.name != "kubelet.sock")


def start(daemon: str, base: Path, standin: KubeletStandIn) -> subprocess.Popen[bytes]:
    cmd, itype = DAEMONS[daemon]
    host = copy_host(base / "h", itype)
    env = {**os.environ, "PYTHONPATH": str(REPO), "KUBECONFIG": str(base / "no-kubeconfig")}
    return subprocess.Popen([sys.executable, "-m", *cmd, "--host-root", str(host.root), *standin.daemon_flags(),
                             "--metrics-port", "0", "--cdi-root", str(base / "cdi")],
                            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


async def wait_line(proc: subprocess.Popen[bytes], text: str) -> None:
    """Read stderr lines until one holds ``text`` (the daemon exiting first, or never logging it, fails)."""
    assert proc.stderr is not None
    stream = proc.stderr
    seen: list[str] = []

    async def read() -> None:
        while True:
            line = (await asyncio.to_thread(stream.readline)).decode(errors="replace")
            assert line, f"exited ({proc.wait()}) before logging {text!r}: {''.join(seen)}"
            seen.append(line)
            if text in line:
                return

    try:
        await asyncio.wait_for(read(), 60)
    except TimeoutError:
        proc.kill()  # ends the reader thread's readline
        raise AssertionError(f"never logged {text!r}: {''.join(seen)}") from None


@contextlib.asynccontextmanager
async def started(daemon: str, tmp: Path) -> AsyncIterator[tuple[KubeletStandIn, subprocess.Popen[bytes]]]:
    """A kubelet stand-in and ``daemon`` started against it; both stopped afterwards (the daemon killed if still
    running)."""
    standin = KubeletStandIn(tmp / "k")
    await standin.start()
    proc = start(daemon, tmp, standin)
    try:
        yield standin, proc
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        await standin.stop()


async def finish(proc: subprocess.Popen[bytes]) -> tuple[int, str]:
    code = await asyncio.to_thread(proc.wait, 30)
    return code, (proc.stderr.read().decode(errors="replace") if proc.stderr else "")


@pytest.mark.parametrize("sig", [signal.SIGHUP, signal.SIGTERM])
@pytest.mark.parametrize("daemon", sorted(DAEMONS))
def test_a_stop_signal_at_once_after_start_is_a_clean_stop(short_tmp: Path, daemon: str, sig: signal.Signals) -> None:
    async def scenario() -> None:
        async with started(daemon, short_tmp) as (standin, proc):
            await wait_line(proc, EARLY_LINE)
            proc.send_signal(sig)  # before the daemon's event loop exists
            code, err = await finish(proc)
            assert code == 0, err
            assert "Traceback" not in err, err
            assert sockets(standin.root) == []
    asyncio.run(scenario())


@pytest.mark.parametrize("daemon, ready", [("efa-device-plugin", "registered with kubelet"),
                                           ("neuron-dra-driver", "plugins_registry")])
def test_sighup_while_serving_removes_the_sockets(short_tmp: Path, daemon: str, ready: str) -> None:
    async def scenario() -> None:
        async with started(daemon, short_tmp) as (standin, proc):
            loop = asyncio.get_running_loop()
            deadline = loop.time() + 60
            while not any(ready in s for s in sockets(standin.root)) and "registered" not in ready:
                assert loop.time() < deadline and proc.poll() is None, "never served"
                await asyncio.sleep(0.05)
            if "registered" in ready:
                await wait_line(proc, ready)
            assert sockets(standin.root), "serving"
            proc.send_signal(signal.SIGHUP)
            code, err = await finish(proc)
            assert code == 0, err
            assert "signal=SIGHUP" in err, err
            assert sockets(standin.root) == []
    asyncio.run(scenario())
