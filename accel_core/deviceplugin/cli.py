"""The command line every device plugin shares, beside :class:`accel_core.dra.cli.DriverCli`: ``serve`` and ``ls``.

- ``serve``: paths, logging and metrics flags, ``--rescan-interval`` and ``--health-poll-interval`` (under the
  plugin's variable names), the plugin's own flags; stop signals are caught before anything else, then the
  plugin's daemon body runs until SIGTERM, SIGINT or SIGHUP (exit 0; 2 for a duplicate instance or socket paths
  that are too long, see :func:`accel_core.daemon.run_daemon`);
- ``ls``: paths and logging flags and ``--output table|json``; prints what the plugin's ``ls`` returns.

This module loads only what parsing and registering need: a plugin's daemon body imports the rest once the kubelet
has its registration.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

from accel_core.cli import (
    EnvArgumentParser,
    EnvFlag,
    add_common_flags,
    add_logging_flags,
    seconds,
    setup_from_args,
)
from accel_core.daemon import catch_stop_signals, run_daemon
from accel_core.paths import HostPaths, add_path_flags

#: The daemon body: ``serve(paths, args)`` (called once logging and paths are set up) gives ``main(stop)``.
Serve = Callable[[HostPaths, argparse.Namespace], Callable[[asyncio.Event], Awaitable[None]]]


@dataclass(frozen=True)
class DevicePluginCli:
    """What differs between two device plugins' command lines."""

    prog: str  #: ``efa-device-plugin``
    description: str
    metrics_port: int
    serve: Serve
    ls: Callable[[HostPaths, argparse.Namespace], str]
    """The ``ls`` output for ``args.output`` (``table`` or ``json``)."""
    rescan_env: str
    rescan_default: float
    health_poll_env: str
    health_poll_default: float
    health_files: str
    """What the health poll reads, for ``--help`` (``the ports' state files``)."""
    flags: tuple[EnvFlag, ...] = ()
    """The plugin's own ``serve`` flags."""
    ls_log_level: str = "INFO"

    def parser(self) -> EnvArgumentParser:
        parser = EnvArgumentParser(prog=self.prog, description=self.description)
        sub = parser.add_subparsers(dest="command", required=True)
        serve = sub.add_parser("serve", help="run the device plugin")
        add_common_flags(serve, metrics_port=self.metrics_port)
        serve.add_env_argument("--rescan-interval", env=self.rescan_env, type=seconds, default=self.rescan_default,
                               help="seconds between full host rescans besides those inotify/udev events and the "
                                    f"health poll start: a safety net (env {self.rescan_env}; default "
                                    f"{self.rescan_default:g})")
        serve.add_env_argument("--health-poll-interval", env=self.health_poll_env, type=seconds,
                               default=self.health_poll_default,
                               help=f"seconds between reads of {self.health_files}, which raise no change event on "
                                    f"real sysfs (env {self.health_poll_env}; default {self.health_poll_default:g})")
        for flag in self.flags:
            flag.add_to(serve)
        ls = sub.add_parser("ls", help="print this host's devices as the plugin would advertise them, and exit")
        add_path_flags(ls)
        add_logging_flags(ls, level=self.ls_log_level)
        ls.add_argument("--output", "-o", choices=("table", "json"), default="table")
        return parser

    def main(self, argv: Sequence[str] | None = None) -> int:
        args = self.parser().parse_args(argv)
        if args.command == "ls":
            print(self.ls(setup_from_args(args, serving=False), args))
            return 0
        catch_stop_signals()
        return run_daemon(self.serve(setup_from_args(args, daemon=self.prog), args), self.prog, serves_grpc=True)

    def run(self) -> None:
        """The console script."""
        sys.exit(self.main())
