"""EFA device plugin and EFA DRA driver: discovery of Elastic Fabric Adapter RDMA devices, the one EFA health rule,
allocation policy, metrics, the device-plugin daemon, and the DRA profile (:mod:`efa_plugin.dra`).

Resource ``vpc.amazonaws.com/efa`` on socket ``aws-efa-device-plugin.sock``: the interface of the upstream plugin,
so existing pod specs and node selectors keep working. See docs/efa-device-plugin.md.
"""

from accel_core.coexistence import Coexistence
from efa_plugin.accelerator import DEVICE_PLUGIN, DRA_DRIVER

RESOURCE_NAME = "vpc.amazonaws.com/efa"
SOCKET_NAME = "aws-efa-device-plugin.sock"
METRICS_PORT = DEVICE_PLUGIN.metrics_port
#: The EFA DRA driver (efa_plugin.dra); it and this device plugin share a node: the DRA driver wins.
DRA_DRIVER_NAME = "efa.aws.com"
DRA_METRICS_PORT = DRA_DRIVER.metrics_port
DRA_HEALTHCHECK_PORT = DRA_DRIVER.health_port or 0
#: The one coexistence rule of the two (accel_core.coexistence), light enough for the device plugin's first Register.
COEXISTENCE = Coexistence("EFA", (SOCKET_NAME,), DRA_DRIVER_NAME, (RESOURCE_NAME,))

__all__ = ["COEXISTENCE", "DRA_DRIVER_NAME", "DRA_HEALTHCHECK_PORT", "DRA_METRICS_PORT", "METRICS_PORT",
           "RESOURCE_NAME", "SOCKET_NAME"]
