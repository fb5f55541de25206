"""``efa-dra-driver``: the EFA DRA kubelet plugin for ``efa.aws.com`` (``serve``, ``slices``, ``remove-slices``;
see :mod:`accel_core.dra.cli`). Metrics on port 9813, liveness on 51516 (efa_plugin/accelerator.py)."""

from __future__ import annotations

import sys
from collections.abc import Sequence

from accel_core.dra.cli import DriverCli
from efa_plugin import DRA_DRIVER_NAME, DRA_HEALTHCHECK_PORT, DRA_METRICS_PORT
from efa_plugin.dra.profile import EfaProfile

CLI = DriverCli(prog="efa-dra-driver", description=f"the EFA DRA kubelet plugin for {DRA_DRIVER_NAME}",
                metrics_port=DRA_METRICS_PORT, healthcheck_port=DRA_HEALTHCHECK_PORT, profile=EfaProfile)


def main(argv: Sequence[str] | None = None) -> int:
    return CLI.main(argv)


if __name__ == "__main__":
    sys.exit(main())
