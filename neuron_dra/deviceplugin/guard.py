"""Coexistence guard: advertise nothing while the Neuron DRA driver is registered on this node.

The DRA driver's kubelet registration socket is ``<plugins_registry>/neuron.aws.com-reg.sock`` (or with a
per-pod suffix, ``neuron.aws.com-<uid>-reg.sock``, during rolling updates). Both mechanisms handing out the same
chips would oversubscribe them silently, so while such a socket exists the plugin's device lists are empty.
"""

from __future__ import annotations

import os

from accel_core.paths import HostPaths
from neuron_dra import DRA_DRIVER_NAME


def dra_registration_sockets(paths: HostPaths) -> list[str]:
    """Names of Neuron DRA registration sockets (or files in their place) in the plugins registry directory."""
    try:
        names = os.listdir(paths.plugins_registry_dir)
    except OSError:
        return []
    return sorted(n for n in names
                  if n.startswith(DRA_DRIVER_NAME) and n.endswith("-reg.sock") and not n.startswith("."))


def blocked_reason(paths: HostPaths) -> str | None:
    socks = dra_registration_sockets(paths)
    if not socks:
        return None
    where = ", ".join(str(paths.plugins_registry_dir / s) for s in socks)
    return (f"the Neuron DRA driver ({DRA_DRIVER_NAME}) is registered on this node ({where}); the device plugin "
            "and the DRA driver would oversubscribe the same Neuron devices, so nothing is advertised until it is "
            "removed")
