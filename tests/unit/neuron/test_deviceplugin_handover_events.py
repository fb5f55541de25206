"""The Node events the device plugin posts under the coexistence rule (accel_core.deviceplugin.handover): standing
down while the DRA driver is there, serving once it is gone: on the change, and at the plugin's start when the
driver has been on the node (a migration rolled back by a node label re-creates the device plugin's pod after the
driver left, and that pod must say it serves). The driver's data directory, ``<kubelet>/plugins/<driver>``, is
where the kubelet's DRA plugins keep their files; the driver leaves it behind (with its claim checkpoint).
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

from accel_core.coexistence import write_presence
from accel_core.deviceplugin.handover import EVENT_SERVING, EVENT_STANDING_DOWN, DraHandover
from accel_core.nodeevents import NodeEvents
from accel_core.paths import HostPaths
from neuron_dra.scanner import NeuronScanner

RULE = NeuronScanner().coexistence


class Recorded(NodeEvents):
    """NodeEvents that keeps the reasons it was asked to post."""

    def __init__(self) -> None:
        super().__init__(lambda: None, "node-1", "test")
        self.reasons: list[str] = []

    def post(self, reason: str, message: str, *, warning: bool = False) -> None:
        self.reasons.append(reason)


def handover(short_tmp: Path) -> tuple[DraHandover, Recorded, HostPaths]:
    paths = HostPaths(host_root=short_tmp / "h", kubelet_root=short_tmp / "k", device_plugins=short_tmp / "dp")
    events = Recorded()
    return DraHandover(RULE, paths, dict, events=events), events, paths


def refresh(h: DraHandover, times: int = 1) -> None:
    async def run() -> None:
        for _ in range(times):
            await h.refresh()
        await h.aclose()

    asyncio.run(run())


def test_a_plugin_starting_where_no_driver_ever_was_posts_nothing(short_tmp: Path) -> None:
    h, events, _ = handover(short_tmp)
    refresh(h, 2)
    assert events.reasons == [] and h.standing_down is None


def test_a_plugin_starting_after_the_driver_left_says_it_serves_once(short_tmp: Path) -> None:
    h, events, paths = handover(short_tmp)
    (paths.plugins_data_dir / RULE.dra_driver).mkdir(parents=True)  # left behind by a driver that was here
    refresh(h, 2)
    assert events.reasons == [EVENT_SERVING]


def test_standing_down_then_serving_when_the_presence_file_goes(short_tmp: Path) -> None:
    h, events, paths = handover(short_tmp)
    presence = RULE.presence_file(paths)
    write_presence(presence, pod_uid="3f1c2a9e-8d7b-4c6a-9e1f-0a2b3c4d5e6f", node="node-1")

    async def run() -> None:
        await h.refresh()
        await h.refresh()
        os.unlink(presence)
        await h.refresh()
        await h.aclose()

    asyncio.run(run())
    assert events.reasons == [EVENT_STANDING_DOWN, EVENT_SERVING]
