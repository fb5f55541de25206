"""The coexistence guard between a device plugin and a DRA driver for the same hardware.

Both handing out the same devices would oversubscribe them silently, so each steps aside while the other is
there: the DRA driver publishes no devices and prepares nothing while the device plugin's socket is in the
kubelet's device-plugins directory, and the device plugin advertises nothing while the DRA driver's registration
socket (``<driver>-reg.sock``, or ``<driver>-<pod uid>-reg.sock`` during a rolling update) is in the plugins
registry. Names starting with ``.`` never count. The DRA driver counts only live sockets; the device plugin also
counts any other file of that name (the safe side: advertising nothing is better than handing a device out
twice), and says which file it is.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Callable
from pathlib import Path


def sockets(directory: Path, wanted: Callable[[str], bool], *, any_file: bool = False) -> list[str]:
    """Names of unix sockets (or of any entry, with ``any_file``) in ``directory`` that ``wanted`` accepts,
    sorted ([] when the directory cannot be read)."""
    try:
        entries = list(os.scandir(directory))
    except OSError:
        return []
    found = []
    for entry in entries:
        if entry.name.startswith(".") or not wanted(entry.name):
            continue
        try:
            if any_file or stat.S_ISSOCK(entry.stat(follow_symlinks=False).st_mode):
                found.append(entry.name)
        except OSError:
            continue
    return sorted(found)


def dra_registration_sockets(registry_dir: Path, driver: str) -> list[str]:
    """The DRA driver's registration sockets (or files of that name) in the kubelet's plugins registry."""
    return sockets(registry_dir, lambda n: n.startswith(f"{driver}-") and n.endswith("-reg.sock"), any_file=True)


def device_plugin_blocks_dra(device_plugins_dir: Path, socket_names: tuple[str, ...], what: str) -> str | None:
    """Why a DRA driver must step aside for a running device plugin (one of ``socket_names``), or None."""
    found = sockets(device_plugins_dir, lambda n: n in socket_names)
    if not found:
        return None
    return (f"the {what} device plugin is running on this node ({', '.join(found)} in {device_plugins_dir}); "
            "the DRA driver publishes no devices and prepares no claims so no device is handed out twice")


def dra_blocks_device_plugin(registry_dir: Path, driver: str, what: str) -> str | None:
    """Why a device plugin must advertise nothing while the DRA driver is registered, or None."""
    found = dra_registration_sockets(registry_dir, driver)
    if not found:
        return None
    where = ", ".join(str(registry_dir / s) for s in found)
    return (f"the {what} DRA driver ({driver}) is registered on this node ({where}); the device plugin and the DRA "
            "driver would oversubscribe the same devices, so nothing is advertised until it is removed")
