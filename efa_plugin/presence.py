"""A cheap guess, before the full host scan, that this node has an EFA to advertise.

It decides only whether the plugin registers with the kubelet before its first scan (the scan and everything it
needs load after that). True when an RDMA device under ``/sys/class/infiniband`` is bound to the ``efa`` driver (the
device-plugin service asks only while the EFA DRA driver does not serve the node). A wrong "no" costs nothing (the
plugin registers after the scan, as it always did); a wrong "yes" registers a resource whose list is empty, as
after devices vanish.
"""

from __future__ import annotations

import os

from accel_core.paths import HostPaths

CLASS_IB = "/sys/class/infiniband"
#: the kernel driver an EFA PCI function is bound to
EFA_DRIVER = "efa"


def efa_expected(paths: HostPaths) -> bool:
    class_dir = paths.host(CLASS_IB)
    try:
        names = os.listdir(class_dir)
    except OSError:
        return False
    for name in names:
        try:
            if os.path.basename(os.readlink(class_dir / name / "device" / "driver")) == EFA_DRIVER:
                return True
        except OSError:
            continue
    return False
