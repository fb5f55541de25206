"""Where a DRA driver's sockets and instance lock live under the kubelet's plugins directory."""

from __future__ import annotations

import contextlib
from pathlib import Path

from accel_core.coexistence import REG_SUFFIX
from accel_core.paths import HostPaths, check_socket_path


def registration_socket_path(paths: HostPaths, driver: str, pod_uid: str | None) -> Path:
    """``<plugins_registry>/<driver>[-<podUID>]-reg.sock`` (the names the device plugins' guard looks for)."""
    return paths.plugins_registry_dir / (f"{driver}-{pod_uid}{REG_SUFFIX}" if pod_uid else f"{driver}{REG_SUFFIX}")


def dra_socket_path(paths: HostPaths, driver: str, pod_uid: str | None) -> Path:
    """``<plugins>/<driver>/dra[-<podUID>].sock``."""
    return paths.plugins_data_dir / driver / (f"dra-{pod_uid}.sock" if pod_uid else "dra.sock")


def instance_lock_path(paths: HostPaths, driver: str, pod_uid: str | None) -> Path:
    """The instance lock beside the DRA socket: ``dra[-<podUID>].lock`` (one per set of socket names)."""
    return dra_socket_path(paths, driver, pod_uid).with_suffix(".lock")


def unlink_stale(path: Path) -> None:
    """Remove a socket a crashed run of this pod left (its name includes our pod UID); the path is checked first."""
    check_socket_path(path)
    with contextlib.suppress(FileNotFoundError):
        path.unlink()  # a stale socket from a crashed run of *this* pod (the name includes our pod UID)
