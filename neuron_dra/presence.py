"""A cheap look, before the full host scan, at whether this node has Neuron devices: one directory listing.

The device plugin uses it to decide whether to register with the kubelet before its first scan (the scan, the
instance catalog and everything else load after that). A wrong "no" costs nothing (it registers after the scan,
as always); a wrong "yes" registers resources whose lists are empty, as after devices vanish.
"""

from __future__ import annotations

import os
import re

from accel_core.paths import HostPaths

#: where the Neuron driver lists its devices (``neuron0``, ``neuron1``, ...)
CLASS_DIR = "/sys/class/neuron_device"
_DEVICE_NAME = re.compile(r"neuron[0-9]+")


def devices_present(paths: HostPaths) -> bool:
    try:
        names = os.listdir(paths.host(CLASS_DIR))
    except OSError:
        return False
    return any(_DEVICE_NAME.fullmatch(name) for name in names)
