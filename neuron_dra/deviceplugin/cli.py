"""``neuron-device-plugin``: ``serve`` (the kubelet device plugin) and ``ls`` (what it would advertise).

The command line is :class:`accel_core.deviceplugin.cli.DevicePluginCli` with the flags of
:mod:`neuron_dra.deviceplugin.options`; ``serve`` is the declaration of :mod:`neuron_dra.deviceplugin.start`,
run by :class:`accel_core.deviceplugin.daemon.DevicePluginService`: it registers first, then loads daemon.py.
"""

from __future__ import annotations

import argparse

from accel_core.deviceplugin.cli import DevicePluginCli
from accel_core.paths import HostPaths
from neuron_dra.accelerator import DEVICE_PLUGIN
from neuron_dra.deviceplugin.options import DEFAULT_HEALTH_POLL_S, DEFAULT_RESCAN_S, FLAGS
from neuron_dra.deviceplugin.start import DAEMON_NAME, serve

__all__ = ["CLI", "METRICS_PORT", "build_parser", "main"]

METRICS_PORT = DEVICE_PLUGIN.metrics_port


def _ls(paths: HostPaths, args: argparse.Namespace) -> str:
    from neuron_dra.deviceplugin.listing import ls  # discovery loads only for ls

    return ls(paths, args)


CLI = DevicePluginCli(prog=DAEMON_NAME,
                      description="Kubernetes device plugin for AWS Neuron devices and NeuronCores",
                      metrics_port=METRICS_PORT, serve=serve, ls=_ls, rescan_env="RESCAN_INTERVAL",
                      rescan_default=DEFAULT_RESCAN_S, health_poll_env="HEALTH_POLL_INTERVAL",
                      health_poll_default=DEFAULT_HEALTH_POLL_S, health_files="the uncorrected-error counters",
                      flags=FLAGS, ls_log_level="WARNING")
build_parser = CLI.parser
main = CLI.main

if __name__ == "__main__":
    CLI.run()
