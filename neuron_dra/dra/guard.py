"""The coexistence guard: the Neuron device plugin and this DRA driver must never both hand out the same chips.

While a Neuron device plugin socket exists in the kubelet's device-plugins directory (``neuron-devplugin.sock``,
``neuroncore-devplugin.sock``, or any other ``*neuron*.sock``), the driver publishes no ResourceSlices and
refuses new prepares, and says why.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path


def device_plugin_sockets(device_plugins_dir: Path) -> list[str]:
    """Names of Neuron device-plugin sockets present in the directory."""
    found = []
    try:
        entries = list(os.scandir(device_plugins_dir))
    except OSError:
        return []
    for entry in entries:
        if "neuron" not in entry.name or not entry.name.endswith(".sock"):
            continue
        try:
            if stat.S_ISSOCK(entry.stat().st_mode):
                found.append(entry.name)
        except OSError:
            continue
    return sorted(found)


def blocked_reason(device_plugins_dir: Path) -> str | None:
    """Why the driver must stay out of the way, or None."""
    sockets = device_plugin_sockets(device_plugins_dir)
    if not sockets:
        return None
    return (f"the Neuron device plugin is running on this node ({', '.join(sockets)} in {device_plugins_dir}); "
            "the DRA driver publishes no devices and prepares no claims so no device is handed out twice")
