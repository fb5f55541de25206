"""EFA device plugin and EFA DRA driver: discovery of Elastic Fabric Adapter RDMA devices, the one EFA health rule,
allocation policy, metrics, the device-plugin daemon, and the DRA profile (:mod:`efa_plugin.dra`).

Resource ``vpc.amazonaws.com/efa`` on socket ``aws-efa-device-plugin.sock``: the interface of the upstream plugin,
so existing pod specs and node selectors keep working. See docs/efa-device-plugin.md.
"""

from accel_core.coexistence import Coexistence

RESOURCE_NAME = "vpc.amazonaws.com/efa"
SOCKET_NAME = "aws-efa-device-plugin.sock"
METRICS_PORT = 9810
#: The EFA DRA driver (efa_plugin.dra); it and this device plugin step aside for each other on a node.
DRA_DRIVER_NAME = "efa.aws.com"
DRA_METRICS_PORT = 9813
#: The one coexistence rule of the two (accel_core.coexistence), light enough for the device plugin's first Register.
COEXISTENCE = Coexistence("EFA", (SOCKET_NAME,), DRA_DRIVER_NAME)

__all__ = ["COEXISTENCE", "DRA_DRIVER_NAME", "DRA_METRICS_PORT", "METRICS_PORT", "RESOURCE_NAME", "SOCKET_NAME"]
