"""Issue 25 item 8: a path or kubeconfig setting that cannot work is one line naming the setting, exit 2, no
traceback; a background task that dies says so."""

from __future__ import annotations

import asyncio
import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest

from accel_core.cli import not_a_directory
from accel_core.kubeconfig import KubeconfigError, load_kubeconfig
from accel_core.tasks import logged_task

REPO = Path(__file__).resolve().parents[3]
PASSWD = "root:x:0:0:root:/root:/bin/bash\ndaemon:x:1:1:daemon:/usr/sbin:/usr/sbin/nologin\n"


def test_not_a_directory_names_the_setting(tmp_path: Path) -> None:
    afile = tmp_path / "file"
    afile.write_text("x")
    assert not_a_directory([("--cdi-root", tmp_path / "new" / "dir")]) is None  # made later
    assert not_a_directory([("--cdi-root", afile)]) == f"--cdi-root {afile} is not a directory"
    assert not_a_directory([("--ok", tmp_path), ("KUBELET_ROOT", afile / "plugins")]) == (
        f"KUBELET_ROOT {afile}/plugins is not a directory ({afile} is not a directory)")
    assert not_a_directory([("KUBELET_ROOT", Path("/dev/null"))]) == "KUBELET_ROOT /dev/null is not a directory"


@pytest.mark.parametrize("content", [PASSWD.encode(), b"\xd0\xcf\x11\xe0 not text", b"- a\n- list\n",
                                     b"clusters: 3\ncontexts: x\n"])
def test_a_file_that_is_no_kubeconfig_is_one_error_naming_the_flag(tmp_path: Path, content: bytes) -> None:
    path = tmp_path / "kubeconfig"
    path.write_bytes(content)
    with pytest.raises(KubeconfigError) as err:
        load_kubeconfig(str(path)).get()
    assert str(err.value).startswith(f"--kubeconfig {path}: not a usable kubeconfig")
    assert "\n" not in str(err.value)


def _run(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", *args], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(REPO), **(env or {})})


@pytest.fixture(scope="module")
def passwd(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("kc") / "passwd"
    path.write_text(PASSWD)
    return path


SERVE = ["serve", "--node-name", "n1", "--healthcheck-port", "-1", "--metrics-port", "0"]


@pytest.mark.parametrize("driver", ["neuron_dra.dra.cli", "efa_plugin.dra.cli"])
@pytest.mark.parametrize("case", ["kubelet-root", "cdi-root", "kubeconfig"])
def test_dra_serve_refuses_bad_settings_in_one_line(tmp_path: Path, passwd: Path, driver: str, case: str) -> None:
    flags = {"kubelet-root": ["--cdi-root", str(tmp_path / "cdi")],
             "cdi-root": ["--kubelet-root", str(tmp_path / "k"), "--cdi-root", str(passwd)],
             "kubeconfig": ["--kubelet-root", str(tmp_path / "k"), "--cdi-root", str(tmp_path / "cdi"),
                            "--kubeconfig", str(passwd)]}[case]
    env = {"KUBELET_ROOT": "/dev/null"} if case == "kubelet-root" else {}
    out = _run(driver, *SERVE, "--host-root", str(tmp_path), *flags, env=env)
    assert out.returncode == 2, out.stderr
    assert "Traceback" not in out.stderr, out.stderr
    expected = {"kubelet-root": "--kubelet-root (env KUBELET_ROOT) /dev/null is not a directory",
                "cdi-root": f"--cdi-root (env CDI_ROOT) {passwd} is not a directory",
                "kubeconfig": f"--kubeconfig {passwd}: not a usable kubeconfig"}[case]
    assert expected in out.stderr.splitlines()[-1], out.stderr


def test_remove_slices_and_extender_refuse_a_bad_kubeconfig(passwd: Path) -> None:
    for args in (["neuron_dra.dra.cli", "remove-slices", "--node-name", "n1", "--kubeconfig", str(passwd)],
                 ["efa_plugin.dra.cli", "remove-slices", "--node-name", "n1"],
                 ["neuron_dra.extender.cli", "serve", "--port", "0", "--metrics-port", "0", "--kubeconfig",
                  str(passwd)]):
        env = {} if "--kubeconfig" in args else {"KUBECONFIG": str(passwd)}
        out = _run(*args, env=env)
        assert out.returncode == 2, (args, out.stderr)
        assert "Traceback" not in out.stderr, out.stderr
        named = f"--kubeconfig {passwd}" if "--kubeconfig" in args else f"KUBECONFIG={passwd}"
        assert f"{named}: not a usable kubeconfig" in out.stderr, out.stderr


def test_a_background_task_that_dies_is_logged_at_once(caplog: pytest.LogCaptureFixture) -> None:
    async def scenario() -> None:
        async def broken() -> None:
            raise AttributeError("'str' object has no attribute 'get'")

        task = logged_task(broken(), "Node publisher")
        await asyncio.sleep(0)
        await asyncio.sleep(0)
        assert task.done()
        records = [r for r in caplog.records if r.levelno == logging.ERROR]
        assert records and "background task died" in records[0].getMessage()
        assert records[0].__dict__.get("task") == "Node publisher" or "Node publisher" in str(records[0].__dict__)
        task.exception()  # retrieved: no "never retrieved" warning

    caplog.set_level(logging.ERROR)
    asyncio.run(scenario())
