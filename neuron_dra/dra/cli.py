"""``neuron-dra-driver``: the Neuron DRA kubelet plugin for ``neuron.aws.com`` (``serve``, ``slices``,
``remove-slices``; see :mod:`accel_core.dra.cli`). Metrics on port 9812."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Any

from accel_core.cli import env_choice
from accel_core.dra.cli import DriverCli
from neuron_dra import DRA_DRIVER_NAME
from neuron_dra.accelerator import DRA_DRIVER
from neuron_dra.dra.cores import MODES, NODE_LABEL
from neuron_dra.dra.profile import NeuronProfile
from neuron_dra.runtime_env import CORE_NUMBERING_FLAG

#: ``--core-devices``: publish each chip's NeuronCores as devices too (neuron_dra.dra.cores).
CORE_DEVICES_FLAG = env_choice("--core-devices", "CORE_DEVICES", MODES, "off",
                               "also publish every chip's logical NeuronCores as devices (DeviceClass "
                               "neuroncore.aws.com), sharing the chip's counters; node-label: only on Nodes "
                               f"labelled {NODE_LABEL}=true")

METRICS_PORT = DRA_DRIVER.metrics_port

def _explain_hints() -> Any:
    from neuron_dra.dra.explain_hints import NEURON_EXPLAIN_HINTS  # the explainer loads with the explain command

    return NEURON_EXPLAIN_HINTS


CLI = DriverCli(prog="neuron-dra-driver", description=f"the Neuron DRA kubelet plugin for {DRA_DRIVER_NAME}",
                metrics_port=METRICS_PORT, healthcheck_port=DRA_DRIVER.health_port or 0,
                profile=NeuronProfile, flags=(CORE_NUMBERING_FLAG, CORE_DEVICES_FLAG),
                explain_hints=_explain_hints)


def main(argv: Sequence[str] | None = None) -> int:
    return CLI.main(argv)


if __name__ == "__main__":
    sys.exit(main())
