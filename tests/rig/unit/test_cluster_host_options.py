"""``accel-cluster up`` takes its fake-host build flags from the accelerators' fake-host parts (their cluster-wide
``CliOption``s): each node's host gets a flag where its part says it applies to the node's type, else the part's
default; a flag that applies to none of the nodes is refused, naming it."""

from __future__ import annotations

import argparse

import pytest
from accel_rig.cluster import _host_options, _parser, _refuse_unused
from accel_rig.controlplane import ControlPlaneError

from accel_core.fakehost.parts import cli_options


def up(*argv: str) -> argparse.Namespace:
    return _parser().parse_args(["up", *argv])


def test_the_flags_are_the_parts_cluster_wide_ones(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        up("--help")
    text = capsys.readouterr().out
    flags = [opt.flag for _part, opt in cli_options(cluster_wide_only=True)]
    assert "--lnc" in flags and "--no-efa" in flags  # Neuron's and EFA's parts declare them
    assert all(flag in text for flag in flags) and "--ultraserver" not in text  # a node's identity is no cluster flag


def test_a_flag_goes_to_the_nodes_whose_type_takes_it() -> None:
    args = up("--node", "a=p5.48xlarge", "--node", "b=trn2.48xlarge", "--lnc", "1", "--no-efa")
    # LNC is a Trainium2 setting (neuron.md); p5 has none: its host keeps the default
    assert _host_options(args, "trn2.48xlarge") == {"efa": False, "lnc": 1}
    assert _host_options(args, "p5.48xlarge") == {"efa": False, "lnc": None}
    assert _host_options(up(), "trn2.48xlarge") == {"efa": True, "lnc": None}
    assert _host_options(args, "p9.unknown") == {"efa": False, "lnc": 1}  # the host build names the unknown type


def test_a_flag_no_node_takes_is_refused() -> None:
    args = up("--node", "a=p5.48xlarge", "--lnc", "2")
    with pytest.raises(ControlPlaneError, match=r"^--lnc 2: none of the nodes' instance types takes it \(p5\.48xlarge"):
        _refuse_unused(args, {"p5.48xlarge": _host_options(args, "p5.48xlarge")})
    ok = up("--node", "a=p5.48xlarge", "--no-efa")
    _refuse_unused(ok, {"p5.48xlarge": _host_options(ok, "p5.48xlarge")})
