"""The coexistence guard between a device plugin and a DRA driver for the same hardware: one rule, both directions.

Both handing out the same devices would oversubscribe them silently, so each steps aside while the other is
there: the DRA driver publishes no devices and prepares nothing while the device plugin is in the kubelet's
device-plugins directory, and the device plugin advertises nothing while the DRA driver is in the plugins
registry.

The rule, from the kubelet's own (docs: kubelet-apis.md): the other side is there when its directory holds a
**unix socket** (checked with ``lstat``: a symlink never counts, so nothing outside the directory is followed; the
kubelet's plugin watcher ignores non-sockets too) whose name does not start with ``.`` and is

- one of the device plugin's socket names, exactly (the names the AWS device plugins register, such as
  ``aws-efa-device-plugin.sock``, ``neuron-devplugin.sock`` and ``neuroncore-devplugin.sock``), or
- the DRA driver's registration socket: ``<driver>-reg.sock``, or ``<driver>-<pod UID>-reg.sock`` during a rolling
  update, where the pod UID is one the driver itself accepts (:func:`accel_core.k8snames.is_uid`). A driver whose
  name merely starts with ours (``neuron.aws.comx``, ``neuron.aws.com.x``) does not count.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from accel_core.k8snames import is_uid
from accel_core.paths import HostPaths

REG_SUFFIX = "-reg.sock"


def sockets(directory: Path, wanted: Callable[[str], bool]) -> list[str]:
    """Names of unix sockets in ``directory`` that ``wanted`` accepts, sorted; hidden names, symlinks and other
    files never count ([] when the directory cannot be read)."""
    try:
        entries = list(os.scandir(directory))
    except OSError:
        return []
    found = []
    for entry in entries:
        if entry.name.startswith(".") or not wanted(entry.name):
            continue
        try:
            if stat.S_ISSOCK(entry.stat(follow_symlinks=False).st_mode):
                found.append(entry.name)
        except OSError:
            continue
    return sorted(found)


def is_registration_socket(name: str, driver: str) -> bool:
    """``<driver>-reg.sock`` or ``<driver>-<pod UID>-reg.sock``."""
    if name == driver + REG_SUFFIX:
        return True
    prefix = driver + "-"
    return (name.startswith(prefix) and name.endswith(REG_SUFFIX)
            and is_uid(name[len(prefix):-len(REG_SUFFIX)]))


@dataclass(frozen=True)
class Coexistence:
    """The guard of one accelerator: its device plugin's socket names and its DRA driver's name."""

    what: str
    """The accelerator as the messages name it (``EFA``, ``Neuron``)."""
    device_plugin_sockets: tuple[str, ...]
    dra_driver: str

    def device_plugin_running(self, paths: HostPaths) -> list[str]:
        return sockets(paths.device_plugins_dir, lambda n: n in self.device_plugin_sockets)

    def dra_driver_registered(self, paths: HostPaths) -> list[str]:
        return sockets(paths.plugins_registry_dir, lambda n: is_registration_socket(n, self.dra_driver))

    def dra_blocked(self, paths: HostPaths) -> str | None:
        """Why the DRA driver must publish and prepare nothing now (the device plugin is running), or None."""
        found = self.device_plugin_running(paths)
        if not found:
            return None
        return (f"the {self.what} device plugin is running on this node ({', '.join(found)} in "
                f"{paths.device_plugins_dir}); the DRA driver publishes no devices and prepares no claims so no "
                "device is handed out twice")

    def device_plugin_blocked(self, paths: HostPaths) -> str | None:
        """Why the device plugin must advertise nothing now (the DRA driver is registered), or None."""
        found = self.dra_driver_registered(paths)
        if not found:
            return None
        where = ", ".join(str(paths.plugins_registry_dir / s) for s in found)
        return (f"the {self.what} DRA driver ({self.dra_driver}) is registered on this node ({where}); the device "
                "plugin and the DRA driver would oversubscribe the same devices, so nothing is advertised until it "
                "is removed")

    def dra_watch_path(self, paths: HostPaths) -> Path:
        """What the DRA driver watches: the device-plugins directory, as a file in it (the watcher then watches
        the directory, not a subtree)."""
        return paths.device_plugins_dir / self.device_plugin_sockets[0]

    def device_plugin_watch_path(self, paths: HostPaths) -> Path:
        """What the device plugin watches: the plugins registry, as a file in it (any pod UID's socket counts)."""
        return paths.plugins_registry_dir / (self.dra_driver + REG_SUFFIX)
