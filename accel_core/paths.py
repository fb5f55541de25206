"""One place that resolves every host path a daemon touches.

The host root is ``/`` on a node and a generated tree in fake-sysfs mode. The kubelet root and the CDI root are
independent of it because inside a container they are host-path mounts at the same location as on the host.
Flags win over environment variables, which win over defaults. The environment names are the ones the upstream
charts use, so the same DaemonSet env works for both.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

DEFAULT_KUBELET_ROOT = Path("/var/lib/kubelet")
#: The kubelet's device manager serves ``kubelet.sock`` here whatever its ``--root-dir`` (the constant
#: ``DevicePluginPath`` of k8s.io/kubelet's deviceplugin/v1beta1 API), so this does not follow the kubelet root.
DEFAULT_DEVICE_PLUGINS_DIR = Path("/var/lib/kubelet/device-plugins")
DEFAULT_CDI_ROOT = Path("/var/run/cdi")

ENV_HOST_ROOT = "HOST_ROOT"
ENV_KUBELET_ROOT = "KUBELET_ROOT"
ENV_DEVICE_PLUGINS_DIR = "DEVICE_PLUGINS_DIR"
ENV_CDI_ROOT = "CDI_ROOT"
ENV_REGISTRAR_DIR = "KUBELET_REGISTRAR_DIRECTORY_PATH"
ENV_PLUGINS_DIR = "KUBELET_PLUGINS_DIRECTORY_PATH"
ENV_NODE_NAME = "NODE_NAME"
ENV_POD_UID = "POD_UID"


@dataclass(frozen=True)
class HostPaths:
    """Resolved roots: where the host's files are, where the kubelet lives, where CDI specs go."""

    host_root: Path = Path("/")
    kubelet_root: Path = DEFAULT_KUBELET_ROOT
    cdi_root: Path = DEFAULT_CDI_ROOT
    registrar_dir: Path | None = None
    plugins_dir: Path | None = None
    device_plugins: Path = DEFAULT_DEVICE_PLUGINS_DIR

    def host(self, path: str | Path) -> Path:
        """Map an absolute host path (``/sys/class/...``) under the host root."""
        return self.host_root / str(path).lstrip("/")

    @property
    def device_plugins_dir(self) -> Path:
        """Where device-plugin sockets and the kubelet's ``kubelet.sock`` live (independent of the kubelet root)."""
        return self.device_plugins

    @property
    def kubelet_socket(self) -> Path:
        return self.device_plugins_dir / "kubelet.sock"

    @property
    def plugins_registry_dir(self) -> Path:
        return self.registrar_dir or self.kubelet_root / "plugins_registry"

    @property
    def plugins_data_dir(self) -> Path:
        return self.plugins_dir or self.kubelet_root / "plugins"

    @property
    def pod_resources_socket(self) -> Path:
        return self.kubelet_root / "pod-resources" / "kubelet.sock"

    def describe(self) -> dict[str, str]:
        """Key/value view for a start-up log line."""
        return {
            "host_root": str(self.host_root),
            "kubelet_root": str(self.kubelet_root),
            "device_plugins": str(self.device_plugins_dir),
            "cdi_root": str(self.cdi_root),
            "plugins_registry": str(self.plugins_registry_dir),
            "plugins": str(self.plugins_data_dir),
        }


def absolute_path(text: str) -> str:
    """A path flag's value: absolute (a relative one would depend on the daemon's working directory)."""
    if not text.startswith("/"):
        raise argparse.ArgumentTypeError(f"expected an absolute path, got {text!r}")
    return text


class _EnvFlags(Protocol):
    """The part of :class:`accel_core.cli.EnvArgumentParser` used here (cli imports this module, not the reverse)."""

    def add_argument_group(self, title: str) -> argparse._ArgumentGroup: ...

    def add_env_argument(self, *flags: str, env: str, type: Callable[[str], Any] = ..., help: str | None = None,
                         group: argparse._ArgumentGroup | None = None) -> argparse.Action: ...


def add_path_flags(parser: _EnvFlags) -> None:
    """Add --host-root, --kubelet-root, --device-plugins-dir, --cdi-root, --registrar-dir and --plugins-dir, each
    falling back to its environment variable through the parser's one env layer (bad values fail like any flag)."""
    g = parser.add_argument_group("paths")

    def flag(name: str, env: str, help: str) -> None:
        parser.add_env_argument(name, env=env, type=absolute_path, group=g, help=help)

    flag("--host-root", ENV_HOST_ROOT, f"root of the host's files, '/' on a node (env {ENV_HOST_ROOT})")
    flag("--kubelet-root", ENV_KUBELET_ROOT, f"kubelet --root-dir (env {ENV_KUBELET_ROOT}; default /var/lib/kubelet)")
    flag("--device-plugins-dir", ENV_DEVICE_PLUGINS_DIR,
         f"the kubelet's device-plugins directory; it does not move with --root-dir "
         f"(env {ENV_DEVICE_PLUGINS_DIR}; default {DEFAULT_DEVICE_PLUGINS_DIR})")
    flag("--cdi-root", ENV_CDI_ROOT, f"directory for CDI specs (env {ENV_CDI_ROOT}; default /var/run/cdi)")
    flag("--registrar-dir", ENV_REGISTRAR_DIR, f"kubelet plugin registration directory (env {ENV_REGISTRAR_DIR})")
    flag("--plugins-dir", ENV_PLUGINS_DIR, f"kubelet plugins data directory (env {ENV_PLUGINS_DIR})")


def resolve_paths(args: argparse.Namespace | None = None, env: Mapping[str, str] | None = None) -> HostPaths:
    """HostPaths from flags parsed by :func:`add_path_flags` (their env fallback already applied by the parser),
    or, with no ``args``, from the environment (``env``, default ``os.environ``) for callers without a parser."""
    if args is None:
        env = os.environ if env is None else env

    def pick(flag: str, env_name: str) -> str | None:
        if args is not None:
            return getattr(args, flag, None) or None
        assert env is not None
        return env.get(env_name) or None

    host_root = pick("host_root", ENV_HOST_ROOT) or "/"
    kubelet_root = pick("kubelet_root", ENV_KUBELET_ROOT) or str(DEFAULT_KUBELET_ROOT)
    device_plugins = pick("device_plugins_dir", ENV_DEVICE_PLUGINS_DIR) or str(DEFAULT_DEVICE_PLUGINS_DIR)
    cdi_root = pick("cdi_root", ENV_CDI_ROOT) or str(DEFAULT_CDI_ROOT)
    registrar = pick("registrar_dir", ENV_REGISTRAR_DIR)
    plugins = pick("plugins_dir", ENV_PLUGINS_DIR)
    return HostPaths(
        host_root=Path(host_root),
        kubelet_root=Path(kubelet_root),
        device_plugins=Path(device_plugins),
        cdi_root=Path(cdi_root),
        registrar_dir=Path(registrar) if registrar else None,
        plugins_dir=Path(plugins) if plugins else None,
    )


UNIX_PATH_MAX = 107


class SocketPathError(ValueError):
    """A unix socket path the kernel cannot bind: a configuration error a daemon reports and exits on."""


def check_socket_path(path: Path) -> None:
    """Raise a clear error when a unix socket path is longer than the kernel allows."""
    size = len(str(path).encode())
    if size > UNIX_PATH_MAX:
        raise SocketPathError(f"socket path {path} is {size} bytes; unix sockets allow {UNIX_PATH_MAX}")
