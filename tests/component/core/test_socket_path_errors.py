"""A socket path longer than the kernel's sun_path (108 bytes with the NUL, see unix(7)) is a configuration error:
each DRA driver exits with status 2 and one log line that names the socket, never a traceback."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from accel_core.fakehost import build_host

MODULES = {"neuron.aws.com": "neuron_dra.dra.cli", "efa.aws.com": "efa_plugin.dra.cli"}


@pytest.mark.parametrize("driver", sorted(MODULES))
def test_too_long_socket_path_is_one_clear_error(tmp_path: Path, driver: str) -> None:
    host = build_host(tmp_path / "host", "trn1.32xlarge")
    deep = tmp_path / ("d" * 110)  # longer than sun_path on its own
    proc = subprocess.run(
        [sys.executable, "-m", MODULES[driver], "serve", "--host-root", str(host.root), "--node-name", "n1",
         "--plugins-dir", str(deep / "plugins"), "--registrar-dir", str(tmp_path / "reg"),
         "--cdi-root", str(tmp_path / "cdi"), "--kubeconfig", str(tmp_path / "none"), "--metrics-port", "0",
         "--healthcheck-port", "0"],
        capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    [line] = [x for x in proc.stderr.splitlines() if "level=ERROR" in x and "socket path" in x]
    assert str(deep / "plugins" / driver / "dra.sock") in line
