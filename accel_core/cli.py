"""The command-line layer every daemon shares: flags that fall back to environment variables, strict value types,
paths, logging and metrics flags.

An option made with :meth:`EnvArgumentParser.add_env_argument` takes its default from an environment variable. The
variable is converted with the option's own type when the parser runs (before ``--help`` too), and a bad value
ends the program with one line naming the variable, e.g.::

    efa-device-plugin serve: error: environment variable METRICS_PORT: expected a port number (0..65535), got 'abc'

A flag given on the command line wins and its variable is not looked at. An empty variable counts as unset (the
way a chart renders an optional value). Numbers accept ASCII digits only (see :mod:`accel_core.hostfiles`).
"""

from __future__ import annotations

import argparse
import ipaddress
import logging
import math
import os
import re
import stat
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from accel_core.hostfiles import HostValueError, describe, parse_int
from accel_core.k8snames import UID_RULE, is_subdomain, is_uid
from accel_core.logs import kv, setup_logging
from accel_core.paths import HostPaths, add_path_flags, resolve_paths

log = logging.getLogger(__name__)

LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")
LOG_FORMATS = ("kv", "json")
#: where metrics listen when nothing says otherwise: only this node can scrape (the charts pass the pod IP)
DEFAULT_METRICS_ADDRESS = "127.0.0.1"

_SECONDS = re.compile(r"[0-9]{1,9}(\.[0-9]{1,9})?", re.ASCII)


# ------------------------------------------------------------------------------------------------ value types
# Each raises argparse.ArgumentTypeError with the reason; argparse prints it for a flag, the parser for a variable.


def _integer(text: str, low: int, high: int, what: str) -> int:
    try:
        return parse_int(text, what, minimum=low, maximum=high)
    except HostValueError:
        raise argparse.ArgumentTypeError(f"expected {what} ({low}..{high}), got {describe(text)}") from None


def port(text: str) -> int:
    """A TCP port, 0 meaning "off" (or "any free port" where the option says so)."""
    return _integer(text, 0, 65535, "a port number")


def port_or_disabled(text: str) -> int:
    """A TCP port, -1 for disabled, 0 for any free port."""
    return _integer(text, -1, 65535, "a port number or -1 for off")


def seconds(text: str) -> float:
    """A positive, finite number of seconds such as ``0.5`` (ASCII digits and one optional dot)."""
    value = _seconds(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be more than 0 seconds, got {describe(text)}")
    return value


def seconds_or_zero(text: str) -> float:
    """Like :func:`seconds` but 0 is allowed (it means "off" where the option says so)."""
    return _seconds(text)


def _seconds(text: str) -> float:
    body = text.strip()
    if not _SECONDS.fullmatch(body):
        raise argparse.ArgumentTypeError(f"expected a number of seconds such as 0.5, got {describe(text)}")
    value = float(body)
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"expected a finite number of seconds, got {describe(text)}")
    return value


def ip_address(text: str) -> str:
    """A literal IPv4 or IPv6 address to listen on (``0.0.0.0`` and ``::`` mean every address)."""
    try:
        return str(ipaddress.ip_address(text.strip()))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an IP address such as 127.0.0.1, got {describe(text)}") from None


def node_name(text: str) -> str:
    """A Kubernetes Node name (a DNS subdomain of at most 253 characters)."""
    if not is_subdomain(text):
        raise argparse.ArgumentTypeError(f"expected a node name (lower-case DNS subdomain), got {describe(text)}")
    return text


def object_name(text: str) -> str:
    """A Kubernetes object or namespace name (a lower-case DNS subdomain of at most 253 characters)."""
    if not is_subdomain(text):
        raise argparse.ArgumentTypeError(f"expected an object name (lower-case DNS subdomain), got {describe(text)}")
    return text


def uid(text: str) -> str:
    """A Kubernetes object UID (:func:`accel_core.k8snames.is_uid`): safe in a file name."""
    if not is_uid(text):
        raise argparse.ArgumentTypeError(f"expected a UID ({UID_RULE}), got {describe(text)}")
    return text


def choice(*values: str, upper: bool = False) -> Callable[[str], str]:
    """One of ``values`` (compared upper-cased when ``upper``)."""

    def convert(text: str) -> str:
        value = text.upper() if upper else text
        if value not in values:
            raise argparse.ArgumentTypeError(f"expected one of {', '.join(values)}, got {describe(text)}")
        return value

    convert.__name__ = "choice"
    return convert


# ------------------------------------------------------------------------------------------------ the parser


@dataclass(frozen=True)
class _EnvOption:
    flags: tuple[str, ...]
    dest: str
    env: str
    convert: Callable[[str], Any]
    default: Any


class EnvArgumentParser(argparse.ArgumentParser):
    """An ArgumentParser whose options may default to environment variables, checked strictly (module docstring).

    Abbreviated long options are off, so ``--metrics-p 1`` cannot silently mean ``--metrics-port``.
    Sub-parsers made with ``add_subparsers`` are of this class too.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)
        self._env_options: list[_EnvOption] = []

    def add_env_argument(self, *flags: str, env: str, type: Callable[[str], Any] = str,
                         default: Any = None, help: str | None = None,
                         group: argparse._ArgumentGroup | None = None, **kwargs: Any) -> argparse.Action:
        """``add_argument(*flags, type=type, default=default)`` whose default comes from ``env`` when it is set
        (listed under ``group`` in --help when one is given)."""
        target = group if group is not None else self
        action = target.add_argument(*flags, type=type, default=default, help=help, **kwargs)
        self._env_options.append(_EnvOption(tuple(flags), action.dest, env, type, default))
        return action

    def parse_known_args(self, args: Sequence[str] | None = None,  # type: ignore[override]
                         namespace: argparse.Namespace | None = None) -> tuple[argparse.Namespace, list[str]]:
        tokens = list(sys.argv[1:] if args is None else args)
        self._apply_environment(tokens)
        return super().parse_known_args(tokens, namespace)

    def _apply_environment(self, tokens: list[str]) -> None:
        for option in self._env_options:
            self.set_defaults(**{option.dest: option.default})  # a parser may be used again with another env
            if any(tok == flag or tok.startswith(flag + "=") for flag in option.flags for tok in tokens):
                continue  # the flag wins over the variable
            raw = os.environ.get(option.env, "")
            if raw == "":
                continue
            try:
                value = option.convert(raw)
            except (argparse.ArgumentTypeError, ValueError, TypeError) as exc:
                self.exit(2, f"{self.prog}: error: environment variable {option.env}: {exc}\n")
            self.set_defaults(**{option.dest: value})


@dataclass(frozen=True)
class EnvFlag:
    """A flag declared once and added to every daemon that takes it (the device plugin and the DRA driver of one
    accelerator, say); with ``env``, its default comes from that variable (:meth:`EnvArgumentParser.add_env_argument`).
    """

    flag: str  #: ``--core-numbering``
    env: str | None
    type: Callable[[str], Any]
    default: Any
    help: str

    @property
    def dest(self) -> str:
        return self.flag.lstrip("-").replace("-", "_")

    def add_to(self, parser: EnvArgumentParser) -> None:
        if self.env is None:
            parser.add_argument(self.flag, type=self.type, default=self.default, help=self.help)
        else:
            parser.add_env_argument(self.flag, env=self.env, type=self.type, default=self.default, help=self.help)


def env_choice(flag: str, env: str, values: tuple[str, ...], default: str, help: str) -> EnvFlag:
    """An :class:`EnvFlag` taking one of ``values``; the help ends with the variable and the default."""
    return EnvFlag(flag, env, choice(*values), default, f"{help} (env {env}; default {default})")


def add_logging_flags(parser: EnvArgumentParser, *, level: str = "INFO") -> None:
    """--log-level (env LOG_LEVEL) and --log-format (env LOG_FORMAT)."""
    parser.add_env_argument("--log-level", env="LOG_LEVEL", type=choice(*LOG_LEVELS, upper=True), default=level,
                            help=f"{', '.join(LOG_LEVELS)} (env LOG_LEVEL; default {level})")
    parser.add_env_argument("--log-format", env="LOG_FORMAT", type=choice(*LOG_FORMATS), default="kv",
                            help="kv (key=value lines) or json (env LOG_FORMAT; default kv)")


def add_common_flags(parser: EnvArgumentParser, *, metrics_port: int | None = None) -> None:
    """Paths (see accel_core.paths), logging flags and, when ``metrics_port`` is given, --metrics-port (env
    METRICS_PORT; 0 disables) and --metrics-address (env METRICS_ADDRESS; default loopback)."""
    add_path_flags(parser)
    add_logging_flags(parser)
    if metrics_port is not None:
        parser.add_env_argument("--metrics-port", env="METRICS_PORT", type=port, default=metrics_port,
                                help=f"Prometheus /metrics port (env METRICS_PORT; default {metrics_port}; "
                                     "0 disables)")
        parser.add_env_argument("--metrics-address", env="METRICS_ADDRESS", type=ip_address,
                                default=DEFAULT_METRICS_ADDRESS,
                                help="IP address the metrics server listens on (env METRICS_ADDRESS; default "
                                     f"{DEFAULT_METRICS_ADDRESS}: this node only; the charts pass the pod IP)")


def safe_stdout() -> None:
    """Print what cannot be encoded as escapes instead of failing (a host file name may hold any bytes)."""
    reconfigure = getattr(sys.stdout, "reconfigure", None)
    if reconfigure is not None:
        reconfigure(errors="backslashreplace")


def no_created_series() -> None:
    """No ``*_created`` series: they double every counter for no operator value. Through the environment, so
    the daemons need not import prometheus_client before their first Register; directly when it is loaded."""
    os.environ["PROMETHEUS_DISABLE_CREATED_SERIES"] = "True"
    metrics = sys.modules.get("prometheus_client.metrics")
    if metrics is not None:
        metrics.disable_created_metrics()


def setup_from_args(args: argparse.Namespace, *, serving: bool = True, daemon: str | None = None) -> HostPaths:
    """Configure logging and resolve paths from parsed common flags (``serving=False`` for read-only commands).
    ``daemon``: the console script; this process then uses only the accelerators it serves, and a fault in those
    is one line and exit 2 (:func:`accel_core.registry.serve_as`), before anything is served."""
    setup_logging(args.log_level, args.log_format)
    if daemon is not None:
        from accel_core.registry import RegistryError, serve_as

        try:
            serve_as(daemon)
        except RegistryError as exc:
            log.error(f"not starting: {exc}", extra=kv(daemon=daemon))
            raise SystemExit(2) from None
    safe_stdout()
    no_created_series()
    paths = resolve_paths(args)
    check_roots(paths, kubelet=serving)
    return paths


def not_a_directory(settings: Sequence[tuple[str, Path]]) -> str | None:
    """One line for the first ``(setting, path)`` where a directory must be made or used but a file is in the way
    (``KUBELET_ROOT=/dev/null``, ``--cdi-root`` naming a file), else None. A path that does not exist yet is fine
    (it is made); the first part of it that exists must be a directory."""
    for name, path in settings:
        for part in (path, *path.parents):
            try:
                st = os.stat(part)
            except (FileNotFoundError, NotADirectoryError):
                continue  # not there yet (or below a file: the part that exists says which)
            except OSError as exc:
                return f"{name} {path}: {part}: {exc.strerror}"
            if not stat.S_ISDIR(st.st_mode):
                where = "" if part == path else f" ({part} is not a directory)"
                return f"{name} {path} is not a directory{where}"
            break
    return None


def check_roots(paths: HostPaths, *, kubelet: bool = True) -> None:
    """One clear line for a host root or kubelet root that is missing or unreadable; the daemon carries on."""
    roots = [("host root", paths.host_root)] + ([("kubelet root", paths.kubelet_root)] if kubelet else [])
    for label, path in roots:
        if not path.is_dir():
            log.error(f"{label} {path} does not exist or is not a directory; carrying on, nothing will be found "
                      "there until it appears", extra=kv(path=str(path)))
        elif not os.access(path, os.R_OK | os.X_OK):
            log.error(f"{label} {path} is not readable; carrying on", extra=kv(path=str(path)))
