"""Coexistence of a device plugin and a DRA driver for the same hardware on one node: one rule, **the DRA driver
wins**.

Both handing out the same devices would oversubscribe them silently (the AWS documents forbid the two on one node),
yet clusters run both charts and move nodes from one to the other. So, at any moment, exactly one side serves a
node:

- **The DRA driver serves whenever it is on the node.** It never stands down for the device plugin; it only leaves
  out of its ResourceSlices the devices that running pods still hold through the device plugin (the kubelet's
  PodResources API), until those pods end.
- **The device plugin advertises nothing while the DRA driver is there**, and "there" outlives a restart of the
  DRA driver's pod: the driver keeps a *presence file* (``<plugins dir>/<driver>/serving.json``) that it refreshes
  every :data:`HEARTBEAT_S` seconds while it runs and leaves in place when its pod merely restarts. The device
  plugin counts the driver as there while its registration socket exists **or** the presence file was refreshed
  less than ``lease`` seconds ago (:data:`DEFAULT_LEASE_S`). A driver that is uninstalled (its DaemonSet gone, or
  no longer meant for this node) removes the file on its way out, so the device plugin takes over within a second;
  a driver that dies and does not come back stops refreshing it, so the device plugin takes over once the lease
  runs out.
- When the device plugin advertises again, devices that running pods hold through DRA claims (PodResources
  ``dynamic_resources``) are advertised Unhealthy (not allocatable) until those pods end.

How the other side is seen, from the kubelet's own rules (docs: kubelet-apis.md): a **unix socket** (``lstat``:
a symlink never counts, nothing outside the directory is followed; the kubelet's plugin watcher ignores
non-sockets too) whose name does not start with ``.`` and is one of the device plugin's socket names exactly, or
the DRA driver's registration socket ``<driver>-reg.sock`` (``<driver>-<pod UID>-reg.sock`` during a rolling
update, with a pod UID the driver itself accepts, :func:`accel_core.k8snames.is_uid`). The presence file counts
only as a regular file (``lstat``).
"""

from __future__ import annotations

import json
import os
import stat
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from accel_core.k8snames import is_uid
from accel_core.paths import HostPaths

REG_SUFFIX = "-reg.sock"
PRESENCE_FILE = "serving.json"
#: how often a running DRA driver refreshes its presence file
HEARTBEAT_S = 10.0
#: how long the device plugin waits, after the presence file's last refresh, before it takes over from a DRA driver
#: whose registration socket is gone: enough for a DaemonSet pod to be re-created and register again (a few
#: seconds with the image on the node), short enough that a node whose DRA driver died does not stay without capacity
DEFAULT_LEASE_S = 45.0


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
    """The rule for one accelerator: its device plugin's socket names and resources, and its DRA driver's name."""

    what: str
    """The accelerator as the messages name it (``EFA``, ``Neuron``)."""
    device_plugin_sockets: tuple[str, ...]
    dra_driver: str
    device_plugin_resources: tuple[str, ...] = ()
    """The extended resources the device plugin serves (what PodResources names its devices by)."""

    # -- what each side sees of the other ---------------------------------------------------------------------------
    def device_plugin_running(self, paths: HostPaths) -> list[str]:
        return sockets(paths.device_plugins_dir, lambda n: n in self.device_plugin_sockets)

    def dra_driver_registered(self, paths: HostPaths) -> list[str]:
        return sockets(paths.plugins_registry_dir, lambda n: is_registration_socket(n, self.dra_driver))

    def presence_file(self, paths: HostPaths) -> Path:
        return paths.plugins_data_dir / self.dra_driver / PRESENCE_FILE

    def presence_age(self, paths: HostPaths, now: float | None = None) -> float | None:
        """Seconds since the DRA driver last refreshed its presence file (0 for a time in the future), or None
        when there is none (missing, not a regular file, unreadable)."""
        try:
            st = os.lstat(self.presence_file(paths))
        except OSError:
            return None
        if not stat.S_ISREG(st.st_mode):
            return None
        return max(0.0, (time.time() if now is None else now) - st.st_mtime)

    def lease_left(self, paths: HostPaths, lease: float = DEFAULT_LEASE_S, now: float | None = None) -> float | None:
        """Seconds until the device plugin may take over from a DRA driver that is not registered but whose
        presence file is still fresh; None when the registration socket decides (or there is no file)."""
        if self.dra_driver_registered(paths):
            return None
        age = self.presence_age(paths, now)
        if age is None or age >= lease:
            return None
        return lease - age

    # -- the rule ---------------------------------------------------------------------------------------------------
    def device_plugin_blocked(self, paths: HostPaths, lease: float = DEFAULT_LEASE_S,
                              now: float | None = None) -> str | None:
        """Why the device plugin must advertise nothing now (the DRA driver serves this node), or None."""
        found = self.dra_driver_registered(paths)
        if found:
            where = ", ".join(str(paths.plugins_registry_dir / s) for s in found)
            return (f"the {self.what} DRA driver ({self.dra_driver}) serves this node (registered: {where}); the "
                    "DRA driver wins, so the device plugin advertises nothing while it is here")
        age = self.presence_age(paths, now)
        if age is not None and age < lease:
            return (f"the {self.what} DRA driver ({self.dra_driver}) serves this node and is restarting (its presence "
                    f"file {self.presence_file(paths)} was refreshed {age:.0f} s ago); the device plugin takes over "
                    f"only if it is not back within {lease - age:.0f} s")
        return None

    def dra_sharing_note(self, paths: HostPaths) -> str | None:
        """What the DRA driver says while the device plugin is also on the node (it does not stand down), or None."""
        found = self.device_plugin_running(paths)
        if not found:
            return None
        return (f"the {self.what} device plugin is also on this node ({', '.join(found)} in "
                f"{paths.device_plugins_dir}); the DRA driver wins: the device plugin advertises nothing while the "
                "driver is here, and devices its running pods hold stay out of the ResourceSlices until they end")

    # -- what each side watches -------------------------------------------------------------------------------------
    def dra_watch_path(self, paths: HostPaths) -> Path:
        """What the DRA driver watches: the device-plugins directory, as a file in it (the watcher then watches
        the directory, not a subtree)."""
        return paths.device_plugins_dir / self.device_plugin_sockets[0]

    def device_plugin_watch_paths(self, paths: HostPaths) -> list[Path]:
        """What the device plugin watches: the plugins registry (any pod UID's socket counts) and the DRA driver's
        presence file, each as a file in its directory."""
        return [paths.plugins_registry_dir / (self.dra_driver + REG_SUFFIX), self.presence_file(paths)]


def write_presence(path: Path, *, pod_uid: str, node: str) -> None:
    """Write (or refresh) a DRA driver's presence file; its mtime is the heartbeat the device plugin reads."""
    from accel_core.atomic import atomic_write_text

    path.parent.mkdir(parents=True, exist_ok=True)
    body = json.dumps({"pod": pod_uid, "node": node, "heartbeatSeconds": HEARTBEAT_S}) + "\n"
    atomic_write_text(path, body, mode=0o644, durable=False)


def remove_presence(path: Path) -> bool:
    """Remove a presence file (the driver is leaving the node for good); True when there was one."""
    try:
        os.unlink(path)
    except FileNotFoundError:
        return False
    return True
