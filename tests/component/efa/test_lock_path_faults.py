"""Issue 33 item 9: the EFA device plugin with something unusable at its instance lock path stops at once with one
line naming the path and what is there, and exit 2 (before: it stayed Running with a traceback per retry, and a
FIFO was reported as another instance). It serves nothing and registers nothing first."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from accel_rig.kubelet_standin import KubeletStandIn
from hostcache import copy_host

from accel_core.instancelock import LOCK_DIR
from efa_plugin import RESOURCE_NAME, SOCKET_NAME

REPO = Path(__file__).resolve().parents[3]


def _symlink(path: Path) -> None:
    (path.parent / "elsewhere").write_text("")
    path.symlink_to(path.parent / "elsewhere")


def _read_only_dir(path: Path) -> None:
    path.mkdir()
    path.chmod(0o555)


FAULTS: dict[str, tuple[Callable[[Path], None], str]] = {
    "symlink": (_symlink, "a symlink"),
    "directory": (lambda p: p.mkdir(), "a directory"),
    "read-only directory": (_read_only_dir, "a directory"),
    "fifo": (lambda p: os.mkfifo(p), "a FIFO"),
}


@pytest.mark.parametrize("fault", sorted(FAULTS))
def test_an_unusable_lock_path_is_one_line_and_exit_2(fault: str, short_tmp: Path) -> None:
    make, kind = FAULTS[fault]
    host = copy_host(short_tmp / "h", "p4d.24xlarge")

    async def scenario() -> tuple[int | None, list[str], list[str]]:
        standin = KubeletStandIn(short_tmp / "k")
        await standin.start()
        lock = standin.dp_dir / LOCK_DIR / f"{SOCKET_NAME}.lock"
        lock.parent.mkdir()
        make(lock)
        proc = subprocess.Popen(
            [sys.executable, "-m", "efa_plugin.cli", "serve", "--host-root", str(host.root), *standin.daemon_flags(),
             "--metrics-port", "0"],
            env={**os.environ, "PYTHONPATH": str(REPO)}, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        try:
            code = await asyncio.to_thread(_wait, proc, 60)
            if code is None:  # still running: the failure this test is about
                proc.kill()
            _, err = await asyncio.to_thread(proc.communicate)
            return code, err.decode().splitlines(), list(standin.registrations)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            await standin.stop()

    code, lines, registrations = asyncio.run(scenario())
    assert code == 2, lines[-5:]
    errors = [line for line in lines if "level=ERROR" in line]
    assert len(errors) == 1 and not any("Traceback" in line for line in lines), lines
    lock = short_tmp / "k" / "device-plugins" / LOCK_DIR / f"{SOCKET_NAME}.lock"
    assert f"the instance lock path {lock} is {kind}, not a regular file" in errors[0], errors[0]
    assert "another instance" not in errors[0]
    assert registrations == [] and not (short_tmp / "k" / "device-plugins" / SOCKET_NAME).exists()
    assert RESOURCE_NAME not in registrations


def _wait(proc: subprocess.Popen[bytes], timeout: float) -> int | None:
    try:
        return proc.wait(timeout)
    except subprocess.TimeoutExpired:
        return None
