"""A cheap look, before the full host scan, at whether this node has Neuron devices: one directory listing.

The device plugin uses it to decide whether to register with the kubelet before its first scan (the scan, the
instance catalog and everything else load after that). A wrong "no" costs nothing (it registers after the scan,
as always); a wrong "yes" registers resources whose lists are empty, as after devices vanish.
"""

from __future__ import annotations

import os

from accel_core.hostfiles import parse_index
from accel_core.paths import HostPaths

#: where the Neuron driver lists its devices (``neuron0``, ``neuron1``, ...)
CLASS_DIR = "/sys/class/neuron_device"


def devices_present(paths: HostPaths) -> bool:
    try:
        names = os.listdir(paths.host(CLASS_DIR))
    except OSError:
        return False
    return any(parse_index(name, "neuron") is not None for name in names)  # as discovery names devices
