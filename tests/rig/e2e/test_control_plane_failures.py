"""Start-up failures surface at once with the failing component's log, and nothing is left running."""

from __future__ import annotations

import os
from pathlib import Path

import psutil
import pytest
from accel_rig.controlplane import ControlPlane
from accel_rig.controlplane_errors import ControlPlaneError
from accel_rig.controlplane_processes import ClusterRecord


def fake_bin_dir(tmp_path: Path, kube_binaries: Path, apiserver_script: str) -> Path:
    """A binaries dir with the real etcd and a shell script posing as kube-apiserver."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "etcd").symlink_to(kube_binaries / "etcd")
    fake = bin_dir / "kube-apiserver"
    fake.write_text("#!/bin/sh\n" + apiserver_script)
    fake.chmod(0o755)
    return bin_dir


def processes_using(state_dir: Path) -> list[str]:
    found = []
    for p in psutil.process_iter(["cmdline"]):
        cmdline = " ".join(p.info["cmdline"] or [])
        if str(state_dir) in cmdline and p.pid != os.getpid():
            found.append(cmdline)
    return found


def test_component_exiting_at_start_fails_fast_with_its_log(tmp_path: Path, kube_binaries: Path) -> None:
    script = 'echo "Error: unknown flag: --bogus-flag" >&2\nexit 3\n'
    bin_dir = fake_bin_dir(tmp_path, kube_binaries, script)
    state = tmp_path / "state"
    cp = ControlPlane(state, bin_dir=bin_dir, with_scheduler=False, with_controller_manager=False)
    with pytest.raises(ControlPlaneError) as err:
        cp.start()
    message = str(err.value)
    assert "kube-apiserver exited with code 3 during start-up" in message
    assert "unknown flag: --bogus-flag" in message
    assert processes_using(state) == []  # etcd, already up, was stopped again
    record = ClusterRecord.load(state)
    assert record is not None and record.processes == ()
    assert "unknown flag" in cp.logs_tail(5)


def test_port_taken_meanwhile_is_retried_on_other_ports(tmp_path: Path, kube_binaries: Path) -> None:
    calls = tmp_path / "calls"
    script = f'echo "$@" >> {calls}\necho "listen tcp 127.0.0.1:1: bind: address already in use" >&2\nexit 1\n'
    bin_dir = fake_bin_dir(tmp_path, kube_binaries, script)
    cp = ControlPlane(tmp_path / "state", bin_dir=bin_dir, with_scheduler=False, with_controller_manager=False)
    with pytest.raises(ControlPlaneError, match="ports were taken three times"):
        cp.start()
    ports = {arg for line in calls.read_text().splitlines() for arg in line.split() if arg.startswith("--secure-port=")}
    assert len(ports) == 3  # a fresh port each attempt
