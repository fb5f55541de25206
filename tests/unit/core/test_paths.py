"""Path resolution (flags over env over defaults) and the start-up root checks."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from accel_core.cli import EnvArgumentParser, check_roots
from accel_core.paths import (
    ENV_CDI_ROOT,
    ENV_DEVICE_PLUGINS_DIR,
    ENV_HOST_ROOT,
    ENV_KUBELET_ROOT,
    ENV_PLUGINS_DIR,
    ENV_REGISTRAR_DIR,
    HostPaths,
    add_path_flags,
    check_socket_path,
    resolve_paths,
)

PATH_ENV = (ENV_HOST_ROOT, ENV_KUBELET_ROOT, ENV_DEVICE_PLUGINS_DIR, ENV_CDI_ROOT, ENV_REGISTRAR_DIR, ENV_PLUGINS_DIR)


def _paths(*argv: str, env: dict[str, str] | None = None) -> HostPaths:
    """Parse ``argv`` with the daemons' parser while the process environment holds exactly ``env`` (for the
    path variables)."""
    parser = EnvArgumentParser()
    add_path_flags(parser)
    with pytest.MonkeyPatch.context() as mp:
        for name in PATH_ENV:
            mp.delenv(name, raising=False)
        for name, value in (env or {}).items():
            mp.setenv(name, value)
        return resolve_paths(parser.parse_args(list(argv)))


def test_defaults() -> None:
    paths = _paths(env={})
    assert paths.host_root == Path("/")
    assert paths.device_plugins_dir == Path("/var/lib/kubelet/device-plugins")
    assert paths.kubelet_socket == Path("/var/lib/kubelet/device-plugins/kubelet.sock")
    assert paths.plugins_registry_dir == Path("/var/lib/kubelet/plugins_registry")
    assert paths.plugins_data_dir == Path("/var/lib/kubelet/plugins")
    assert paths.pod_resources_socket == Path("/var/lib/kubelet/pod-resources/kubelet.sock")
    assert paths.cdi_root == Path("/var/run/cdi")


def test_env_then_flags_win() -> None:
    env = {"HOST_ROOT": "/fake", "KUBELET_ROOT": "/data/kubelet", "CDI_ROOT": "/etc/cdi",
           "KUBELET_REGISTRAR_DIRECTORY_PATH": "/reg", "KUBELET_PLUGINS_DIRECTORY_PATH": "/plug"}
    paths = _paths(env=env)
    assert paths.host("/sys/class/infiniband") == Path("/fake/sys/class/infiniband")
    # The kubelet serves device plugins at its fixed DevicePluginPath whatever its --root-dir (k8s.io/kubelet
    # deviceplugin/v1beta1 constants.go), so a relocated kubelet root must not move it.
    assert paths.device_plugins_dir == Path("/var/lib/kubelet/device-plugins")
    assert (paths.plugins_registry_dir, paths.plugins_data_dir, paths.cdi_root) == (
        Path("/reg"), Path("/plug"), Path("/etc/cdi"))
    flagged = _paths("--host-root", "/other", "--kubelet-root", "/k", env=env)
    assert flagged.host_root == Path("/other") and flagged.kubelet_root == Path("/k")


def test_device_plugins_dir_has_its_own_flag_and_env() -> None:
    from_env = _paths(env={"DEVICE_PLUGINS_DIR": "/node1/device-plugins", "KUBELET_ROOT": "/k"})
    assert from_env.device_plugins_dir == Path("/node1/device-plugins")
    assert from_env.kubelet_socket == Path("/node1/device-plugins/kubelet.sock")
    assert from_env.pod_resources_socket == Path("/k/pod-resources/kubelet.sock")  # this one does follow the root
    flagged = _paths("--device-plugins-dir", "/dp", env={"DEVICE_PLUGINS_DIR": "/env"})
    assert flagged.device_plugins_dir == Path("/dp")


def test_missing_roots_log_one_clear_line_each(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.ERROR)
    check_roots(HostPaths(host_root=tmp_path / "nope", kubelet_root=tmp_path))
    errors = [r.getMessage() for r in caplog.records]
    assert len(errors) == 1 and str(tmp_path / "nope") in errors[0]


def test_socket_path_limit_is_named() -> None:
    with pytest.raises(ValueError, match="unix sockets allow 107"):
        check_socket_path(Path("/" + "x" * 120))
    check_socket_path(Path("/var/lib/kubelet/device-plugins/aws-efa-device-plugin.sock"))


def test_no_args_reads_the_environment_for_callers_without_a_parser() -> None:
    assert resolve_paths(env={"HOST_ROOT": "/fake"}).host_root == Path("/fake")


def test_an_empty_path_variable_counts_as_unset() -> None:
    assert _paths(env={"HOST_ROOT": ""}).host_root == Path("/")


def test_a_relative_path_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        _paths(env={"CDI_ROOT": "cdi"})
    assert "environment variable CDI_ROOT: expected an absolute path, got 'cdi'" in capsys.readouterr().err
