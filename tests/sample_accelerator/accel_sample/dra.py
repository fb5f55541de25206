"""``sample-dra-driver``: the DRA profile of ``sacc.example.com`` on the sample scanner."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

import msgspec

from accel_core.dra.cli import DriverCli
from accel_core.dra.config import decode_struct
from accel_core.dra.profile import RequestEdits, Scan
from accel_core.dra.slicemodel import SliceDevice, Version
from accel_core.dra.types import ClaimError
from accel_core.edits import ContainerEdits, DeviceNode
from accel_core.paths import HostPaths
from accel_sample import DRA, DRIVER
from accel_sample.scanner import Sacc, SaccScanner


@dataclass(frozen=True)
class SaccConfig:
    """The decoded config: no settings."""


class SaccParams(msgspec.Struct, tag_field="kind", tag="SaccConfig", forbid_unknown_fields=True, frozen=True):
    """``SaccConfig`` parameters (``apiVersion: sacc.example.com/v1``)."""

    apiVersion: Literal["sacc.example.com/v1"]  # noqa: N815 (the API's field name)


class SaccProfile:
    driver_name = DRIVER
    metrics_prefix = "sacc_dra"
    default_config = SaccConfig()

    def __init__(self) -> None:
        self.scanner = SaccScanner()

    def scan(self, paths: HostPaths, dra_version: str) -> Scan[tuple[Sacc, ...]]:
        host = self.scanner.scan(paths)
        devices = tuple(SliceDevice(d.id, {"index": d.index, "model": d.model, "draDriverVersion": Version(dra_version),
                                           **({"numaNode": d.numa} if d.numa is not None else {})})
                        for d in host.inventory)
        return Scan(host.inventory, devices, host.health, host.problems)

    def decode_config(self, parameters: Any, where: str) -> SaccConfig:
        decode_struct(parameters, where, (SaccParams,))
        return SaccConfig()

    def container_edits(self, inventory: tuple[Sacc, ...], request: str, devices: Sequence[str],
                        config: SaccConfig) -> RequestEdits:
        by_id = {d.id: d for d in inventory}
        bad = [n for n in devices if n not in by_id or not by_id[n].health.healthy]
        if bad:
            raise ClaimError(f"devices {bad} (request {request}) are not usable sacc devices of this node")
        edits = {n: ContainerEdits(device_nodes=(DeviceNode(by_id[n].node, major=by_id[n].major,
                                                            minor=by_id[n].minor),)) for n in devices}
        env = (("SACC_VISIBLE_DEVICES", ",".join(str(i) for i in sorted(by_id[n].index for n in devices))),)
        return RequestEdits(edits, ContainerEdits(env=env))


CLI = DriverCli(prog=DRA.script, description=f"the DRA kubelet plugin for {DRIVER}", metrics_port=DRA.metrics_port,
                healthcheck_port=DRA.health_port or 0, profile=SaccProfile)


def main(argv: Sequence[str] | None = None) -> int:
    return CLI.main(argv)


if __name__ == "__main__":
    sys.exit(main())
