"""Path resolution (flags over env over defaults) and the start-up root checks."""

from __future__ import annotations

import argparse
import logging
from pathlib import Path

import pytest

from accel_core.cli import check_roots
from accel_core.paths import HostPaths, add_path_flags, check_socket_path, resolve_paths


def _parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_path_flags(parser)
    return parser.parse_args(list(argv))


def test_defaults() -> None:
    paths = resolve_paths(_parse(), env={})
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
    paths = resolve_paths(_parse(), env=env)
    assert paths.host("/sys/class/infiniband") == Path("/fake/sys/class/infiniband")
    # The kubelet serves device plugins at its fixed DevicePluginPath whatever its --root-dir (k8s.io/kubelet
    # deviceplugin/v1beta1 constants.go), so a relocated kubelet root must not move it.
    assert paths.device_plugins_dir == Path("/var/lib/kubelet/device-plugins")
    assert (paths.plugins_registry_dir, paths.plugins_data_dir, paths.cdi_root) == (
        Path("/reg"), Path("/plug"), Path("/etc/cdi"))
    flagged = resolve_paths(_parse("--host-root", "/other", "--kubelet-root", "/k"), env=env)
    assert flagged.host_root == Path("/other") and flagged.kubelet_root == Path("/k")


def test_device_plugins_dir_has_its_own_flag_and_env() -> None:
    from_env = resolve_paths(_parse(), env={"DEVICE_PLUGINS_DIR": "/node1/device-plugins", "KUBELET_ROOT": "/k"})
    assert from_env.device_plugins_dir == Path("/node1/device-plugins")
    assert from_env.kubelet_socket == Path("/node1/device-plugins/kubelet.sock")
    assert from_env.pod_resources_socket == Path("/k/pod-resources/kubelet.sock")  # this one does follow the root
    flagged = resolve_paths(_parse("--device-plugins-dir", "/dp"), env={"DEVICE_PLUGINS_DIR": "/env"})
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
