"""Issue 14 item 9: a bad environment value gives one line naming the variable, for every env-backed flag of every
daemon CLI, also with --help; never a traceback."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from collections.abc import Callable, Iterator, Sequence

import pytest

from accel_core.cli import EnvArgumentParser
from efa_plugin import cli as efa_cli
from efa_plugin.dra import cli as efa_dra_cli
from neuron_dra.deviceplugin import cli as neuron_cli
from neuron_dra.dra import cli as dra_cli

Main = Callable[[Sequence[str] | None], int]
PARSERS: dict[str, tuple[Callable[[], EnvArgumentParser], Main]] = {
    "efa-device-plugin": (efa_cli.build_parser, efa_cli.main),
    "neuron-device-plugin": (neuron_cli.build_parser, neuron_cli.main),
    "neuron-dra-driver": (dra_cli.CLI.parser, dra_cli.main),
    "efa-dra-driver": (efa_dra_cli.CLI.parser, efa_dra_cli.main),
}


def subcommands(parser: EnvArgumentParser) -> Iterator[tuple[str, EnvArgumentParser]]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            yield from action.choices.items()


def env_options() -> list[tuple[str, str, str]]:
    """(program, subcommand, variable) for every env-backed option the daemons declare."""
    out = []
    for prog, (build, _) in PARSERS.items():
        for name, sub in subcommands(build()):
            out += [(prog, name, opt.env) for opt in sub._env_options]
    return out


def test_the_daemons_declare_their_variables() -> None:
    declared = {(p, s, v) for p, s, v in env_options()}
    for expected in [("efa-device-plugin", "serve", "METRICS_PORT"), ("efa-device-plugin", "serve", "METRICS_ADDRESS"),
                     ("efa-device-plugin", "serve", "EFA_RESCAN_INTERVAL"), ("efa-device-plugin", "ls", "LOG_LEVEL"),
                     ("neuron-device-plugin", "serve", "RESCAN_INTERVAL"),
                     ("neuron-device-plugin", "serve", "POD_RESOURCES_INTERVAL"),
                     ("neuron-device-plugin", "serve", "ALLOCATION_GRACE"),
                     ("neuron-device-plugin", "serve", "NEURON_CORE_NUMBERING"),
                     ("neuron-dra-driver", "serve", "HEALTHCHECK_PORT"), ("neuron-dra-driver", "serve", "POD_UID"),
                     ("neuron-dra-driver", "serve", "NODE_NAME"), ("neuron-dra-driver", "slices", "NODE_NAME"),
                     ("neuron-dra-driver", "serve", "RESCAN_INTERVAL"),
                     ("neuron-dra-driver", "serve", "NEURON_CORE_NUMBERING"),
                     ("neuron-dra-driver", "slices", "NEURON_CORE_NUMBERING"),
                     ("efa-dra-driver", "serve", "HEALTH_POLL_INTERVAL"),
                     ("neuron-dra-driver", "remove-slices", "LOG_LEVEL")]:
        assert expected in declared


@pytest.mark.parametrize(("prog", "sub", "variable"), env_options())
@pytest.mark.parametrize("help_flag", [False, True])
def test_every_variable_with_a_bad_value(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
                                         prog: str, sub: str, variable: str, help_flag: bool) -> None:
    monkeypatch.setenv(variable, "²x")  # no option of any daemon takes this
    monkeypatch.setenv("NODE_NAME", os.environ.get("NODE_NAME", "n1") if variable != "NODE_NAME" else "²x")
    _, main = PARSERS[prog]
    with pytest.raises(SystemExit) as exited:
        main([sub, *(["--help"] if help_flag else [])])
    assert exited.value.code == 2
    captured = capsys.readouterr()
    assert captured.out == ""  # no help text and no half-run command
    lines = captured.err.splitlines()
    assert len(lines) == 1, captured.err
    assert lines[0].startswith(f"{prog} {sub}: error: environment variable {variable}: ")
    assert "'²x'" in lines[0]


@pytest.mark.parametrize(("prog", "argv", "variable", "value", "reason"), [
    ("efa-device-plugin", ["serve"], "METRICS_PORT", "abc", "expected a port number (0..65535), got 'abc'"),
    ("efa-device-plugin", ["serve"], "METRICS_PORT", "70000", "(0..65535)"),
    ("efa-device-plugin", ["serve"], "METRICS_PORT", "９８１０", "(0..65535)"),
    ("efa-device-plugin", ["serve"], "METRICS_ADDRESS", "0.0.0.0:1", "expected an IP address"),
    ("efa-device-plugin", ["serve"], "EFA_RESCAN_INTERVAL", "nan", "number of seconds"),
    ("efa-device-plugin", ["serve"], "EFA_RESCAN_INTERVAL", "0", "more than 0 seconds"),
    ("efa-device-plugin", ["serve"], "LOG_FORMAT", "xml", "one of kv, json"),
    ("efa-device-plugin", ["ls"], "LOG_LEVEL", "loud", "one of DEBUG, INFO, WARNING, ERROR"),
    ("neuron-device-plugin", ["serve"], "RESCAN_INTERVAL", "x", "number of seconds"),
    ("neuron-device-plugin", ["serve"], "POD_RESOURCES_INTERVAL", "inf", "number of seconds"),
    ("neuron-device-plugin", ["serve"], "ALLOCATION_GRACE", "-1", "number of seconds"),
    ("neuron-device-plugin", ["serve"], "NEURON_CORE_NUMBERING", "both", "one of container, host"),
    ("neuron-dra-driver", ["serve", "--node-name", "n1"], "HEALTHCHECK_PORT", "...", "or -1 for off (-1..65535)"),
    ("neuron-dra-driver", ["serve", "--node-name", "n1"], "POD_UID", "../../etc", "expected a UID"),
    ("neuron-dra-driver", ["slices"], "NODE_NAME", "Node_1", "expected a node name"),
    ("neuron-dra-driver", ["serve", "--node-name", "n1"], "NEURON_CORE_NUMBERING", "both", "one of container, host"),
])
def test_reported_values(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], prog: str,
                         argv: list[str], variable: str, value: str, reason: str) -> None:
    monkeypatch.setenv(variable, value)
    with pytest.raises(SystemExit) as exited:
        PARSERS[prog][1](argv)
    assert exited.value.code == 2
    [line] = capsys.readouterr().err.splitlines()
    assert line.startswith(f"{prog} {argv[0]}: error: environment variable {variable}: ") and reason in line


def test_good_values_flags_win_and_empty_means_unset(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("METRICS_PORT", "9999")
    monkeypatch.setenv("METRICS_ADDRESS", "10.0.3.7")
    monkeypatch.setenv("EFA_RESCAN_INTERVAL", "0.25")
    monkeypatch.setenv("LOG_LEVEL", "debug")
    args = efa_cli.build_parser().parse_args(["serve"])
    assert (args.metrics_port, args.metrics_address, args.rescan_interval, args.log_level) == (
        9999, "10.0.3.7", 0.25, "DEBUG")
    monkeypatch.setenv("METRICS_PORT", "abc")
    assert efa_cli.build_parser().parse_args(["serve", "--metrics-port", "0"]).metrics_port == 0
    assert efa_cli.build_parser().parse_args(["serve", "--metrics-port=7"]).metrics_port == 7
    monkeypatch.setenv("METRICS_PORT", "")
    monkeypatch.delenv("METRICS_ADDRESS")
    args = efa_cli.build_parser().parse_args(["serve"])
    assert (args.metrics_port, args.metrics_address) == (9810, "127.0.0.1")  # loopback unless the chart says
    monkeypatch.setenv("HEALTHCHECK_PORT", "-1")
    assert dra_cli.CLI.parser().parse_args(["serve"]).healthcheck_port == -1


def test_a_parser_used_twice_forgets_the_first_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    parser = efa_cli.build_parser()
    monkeypatch.setenv("METRICS_PORT", "1234")
    assert parser.parse_args(["serve"]).metrics_port == 1234
    monkeypatch.delenv("METRICS_PORT")
    assert parser.parse_args(["serve"]).metrics_port == 9810


def test_flags_use_the_same_strict_types(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        efa_cli.build_parser().parse_args(["serve", "--metrics-port", "+80"])
    assert "argument --metrics-port: expected a port number" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        efa_cli.build_parser().parse_args(["serve", "--metrics-p", "80"])  # no abbreviations
    assert "unrecognized arguments" in capsys.readouterr().err


@pytest.mark.parametrize("prog", list(PARSERS))
def test_installed_command_prints_one_line(prog: str) -> None:
    env = {**os.environ, "METRICS_PORT": "abc", "NODE_NAME": "n1"}
    res = subprocess.run([os.path.join(os.path.dirname(sys.executable), prog), "serve", "--help"], env=env,
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 2
    assert res.stdout == "" and "Traceback" not in res.stderr
    assert res.stderr == f"{prog} serve: error: environment variable METRICS_PORT: expected a port number " \
                         "(0..65535), got 'abc'\n"


@pytest.mark.parametrize(("argv", "env", "numbering"), [
    ([], None, "container"),  # the device plugin's default
    ([], "host", "host"),
    (["--core-numbering", "host"], "container", "host"),
])
def test_the_dra_driver_takes_the_device_plugins_core_numbering(monkeypatch: pytest.MonkeyPatch, argv: list[str],
                                                                env: str | None, numbering: str) -> None:
    if env is not None:
        monkeypatch.setenv("NEURON_CORE_NUMBERING", env)
    else:
        monkeypatch.delenv("NEURON_CORE_NUMBERING", raising=False)
    plugin = neuron_cli.build_parser().parse_args(["serve", *argv])
    args = dra_cli.CLI.parser().parse_args(["serve", "--node-name", "n1", *argv])
    assert plugin.core_numbering == args.core_numbering == numbering
    assert dra_cli.CLI.make_profile(args).core_numbering == numbering  # type: ignore[attr-defined]
