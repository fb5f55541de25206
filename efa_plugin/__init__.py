"""EFA device plugin: discovery of Elastic Fabric Adapter RDMA devices, allocation policy, metrics and the daemon.

Resource ``vpc.amazonaws.com/efa`` on socket ``aws-efa-device-plugin.sock``: the interface of the upstream plugin,
so existing pod specs and node selectors keep working. See docs/efa-device-plugin.md.
"""

RESOURCE_NAME = "vpc.amazonaws.com/efa"
SOCKET_NAME = "aws-efa-device-plugin.sock"
METRICS_PORT = 9810

__all__ = ["METRICS_PORT", "RESOURCE_NAME", "SOCKET_NAME"]
