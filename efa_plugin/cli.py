"""``efa-device-plugin``: the EFA device-plugin daemon (``serve``) and a read-only inventory view (``ls``).

    efa-device-plugin serve [--host-root DIR] [--kubelet-root DIR] [--metrics-port 9810] [--rescan-interval 60]
                            [--health-poll-interval 0.75]
    efa-device-plugin ls [--host-root DIR] [--output table|json]

``serve`` never exits for a node without EFA: it logs one line, advertises nothing, keeps watching and registers
once devices appear. SIGTERM, SIGINT and SIGHUP stop it cleanly (socket removed, exit status 0). The command line
is :class:`accel_core.deviceplugin.cli.DevicePluginCli`; the daemon is :mod:`efa_plugin.daemon`'s
declaration, run by :class:`accel_core.deviceplugin.daemon.DevicePluginService`.
"""

from __future__ import annotations

import argparse

from accel_core.cli import EnvFlag, node_name
from accel_core.deviceplugin.cli import DevicePluginCli
from accel_core.paths import ENV_NODE_NAME, HostPaths
from efa_plugin import METRICS_PORT, RESOURCE_NAME
from efa_plugin.daemon import DAEMON_NAME, DEFAULT_HEALTH_POLL_S, DEFAULT_RESCAN_S, serve

__all__ = ["CLI", "build_parser", "main"]


def _ls(paths: HostPaths, args: argparse.Namespace) -> str:
    from efa_plugin.listing import ls  # discovery loads only for ls

    return ls(paths, args)


#: ``efa-device-plugin serve``'s own flags: where to post the Events about its Node.
FLAGS = (
    EnvFlag("--node-name", ENV_NODE_NAME, node_name, None,
            "this node's name, for the Events the plugin posts on its Node when it stands down for the EFA DRA "
            "driver or serves again (env NODE_NAME; none: the events are only logged)"),
    EnvFlag("--kubeconfig", None, str, None,
            "kubeconfig for those Events (default: KUBECONFIG, then in-cluster)"),
)

CLI = DevicePluginCli(prog=DAEMON_NAME, description=f"Kubernetes device plugin for AWS EFA ({RESOURCE_NAME}).",
                      metrics_port=METRICS_PORT, serve=serve, ls=_ls, rescan_env="EFA_RESCAN_INTERVAL",
                      rescan_default=DEFAULT_RESCAN_S, health_poll_env="EFA_HEALTH_POLL_INTERVAL",
                      health_poll_default=DEFAULT_HEALTH_POLL_S, health_files="the ports' state files",
                      flags=FLAGS)
build_parser = CLI.parser
main = CLI.main

if __name__ == "__main__":
    CLI.run()
