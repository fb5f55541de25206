"""The unhealthy taint's hysteresis (accel_core/dra/taints.py) with an injected clock, the publisher's coalescing of
health-only writes (against the in-memory API double of test_dra_slices), and the CLI settings.

Facts the expectations use: the API server keeps a taint's ``timeAdded`` in whole seconds (RFC 3339) and, when a
write carries a taint without one, stamps the time of that write (seen on the rig's kube-apiserver 1.37: a replace
with the same taint and no timeAdded moved it from 04:05:04 to 04:05:06); the health poll runs every 0.75 s.
"""

from __future__ import annotations

import asyncio
import dataclasses
from datetime import UTC, datetime

import pytest
from accel_rig.polling import until
from test_dra_slices import DRIVER, FakeApi, devices, run_with, watching

from accel_core.dra.publisher import SlicePublisher
from accel_core.dra.slicemodel import SliceDevice, Taint
from accel_core.dra.taints import DEFAULT_NOEXECUTE_AFTER, UnhealthyTaints
from accel_core.health import DeviceHealth
from neuron_dra.dra.cli import CLI

KEY = f"{DRIVER}/unhealthy"
DOWN = DeviceHealth(False, "PortDown", "port 1 is DOWN")
UP = DeviceHealth(True)
T0 = 1_780_000_000.0  # 2026-05-28T21:46:40Z


class Clock:
    def __init__(self, now: float = T0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def at(seconds: float) -> datetime:
    return datetime.fromtimestamp(seconds, UTC)


def taint_of(devs: list[SliceDevice], name: str) -> tuple[str, str, datetime | None] | None:
    (dev,) = [d for d in devs if d.name == name]
    return (dev.taints[0].value, dev.taints[0].effect, dev.taints[0].time_added) if dev.taints else None


def test_default_hold_is_well_above_a_health_poll() -> None:
    assert DEFAULT_NOEXECUTE_AFTER >= 10 * 0.75


def test_noexecute_waits_for_the_hold_with_noschedule_at_once() -> None:
    clock = Clock(T0 + 0.4)
    taints = UnhealthyTaints(DRIVER, "NoExecute", noexecute_after=30, clock=clock)
    devs = devices(2)
    out = taints.apply(devs, {"dev-0": DOWN})
    assert taint_of(out, "dev-0") == ("PortDown", "NoSchedule", at(T0)), "at once, stamped in whole seconds"
    assert taint_of(out, "dev-1") is None
    assert taints.next_change() == T0 + 30.4
    clock.now = T0 + 30.3
    assert taint_of(taints.apply(devs, {"dev-0": DOWN}), "dev-0")[1] == "NoSchedule"  # type: ignore[index]
    clock.now = T0 + 30.4
    out = taints.apply(devs, {"dev-0": DOWN})
    assert taint_of(out, "dev-0") == ("PortDown", "NoExecute", at(T0 + 30)), "stamped when the hold ended"
    assert taints.next_change() is None
    clock.now = T0 + 95
    assert taint_of(taints.apply(devs, {"dev-0": DOWN}), "dev-0") == ("PortDown", "NoExecute", at(T0 + 30)), \
        "the same taint, the same time, however often the host is re-read"


def test_a_flapping_device_never_reaches_noexecute() -> None:
    """A port DOWN for 0.2 s out of every 0.4 s, as the 0.75 s poll sees it, for ten minutes."""
    clock = Clock()
    taints = UnhealthyTaints(DRIVER, "NoExecute", noexecute_after=30, clock=clock)
    effects = set()
    for i in range(800):
        clock.now = T0 + i * 0.75
        down = (i * 0.75) % 0.4 < 0.2
        out = taints.apply(devices(1), {"dev-0": DOWN if down else UP})
        if (t := taint_of(out, "dev-0")) is not None:
            effects.add(t[1])
    assert effects == {"NoSchedule"}


def test_noschedule_effect_and_recovery_forget_the_time() -> None:
    clock = Clock()
    taints = UnhealthyTaints(DRIVER, "NoSchedule", clock=clock)
    assert taint_of(taints.apply(devices(1), {"dev-0": DOWN}), "dev-0") == ("PortDown", "NoSchedule", at(T0))
    assert taints.next_change() is None, "nothing to upgrade"
    clock.now = T0 + 100
    assert taint_of(taints.apply(devices(1), {"dev-0": DOWN}), "dev-0") == ("PortDown", "NoSchedule", at(T0))
    assert taint_of(taints.apply(devices(1), {}), "dev-0") is None
    clock.now = T0 + 200
    assert taint_of(taints.apply(devices(1), {"dev-0": DOWN}), "dev-0") == ("PortDown", "NoSchedule", at(T0 + 200))


def test_seed_keeps_the_time_of_a_taint_that_persists_across_a_restart() -> None:
    clock = Clock(T0 + 500)
    taints = UnhealthyTaints(DRIVER, "NoExecute", noexecute_after=30, clock=clock)
    out = taints.apply(devices(3), {"dev-0": DOWN, "dev-1": DOWN})  # the restarted driver's first scan
    assert taint_of(out, "dev-0") == ("PortDown", "NoSchedule", at(T0 + 500))
    published = {"dev-0": (Taint(KEY, "PortDown", "NoExecute", at(T0 + 30)),),   # NoExecute since T0 + 30
                 "dev-1": (Taint(KEY, "PortDown", "NoSchedule", at(T0 + 490)),),  # held 10 s so far
                 "dev-2": (Taint(KEY, "PortDown", "NoSchedule", at(T0)),),        # healthy again: not kept
                 "dev-9": (Taint("other.example.com/x", "", "NoSchedule", at(T0)),)}
    assert taints.seed(published)
    out = taints.apply(devices(3), {"dev-0": DOWN, "dev-1": DOWN})
    assert taint_of(out, "dev-0") == ("PortDown", "NoExecute", at(T0 + 30)), "no downgrade, the same timeAdded"
    assert taint_of(out, "dev-1") == ("PortDown", "NoSchedule", at(T0 + 490))
    assert taint_of(out, "dev-2") is None
    assert taints.next_change() == T0 + 520, "dev-1's hold counts from when it was first seen unhealthy"
    assert not taints.seed({"dev-1": (Taint(KEY, "PortDown", "NoSchedule", at(T0)),)}), "only the first listing"


def test_run_calls_back_when_a_hold_ends() -> None:
    async def scenario() -> None:
        loop = asyncio.get_running_loop()
        taints = UnhealthyTaints(DRIVER, "NoExecute", noexecute_after=0.3)
        calls: list[float] = []
        stop = asyncio.Event()
        task = asyncio.create_task(taints.run(stop, lambda: calls.append(loop.time())))
        start = loop.time()
        taints.apply(devices(1), {"dev-0": DOWN})
        await until(lambda: bool(calls), "the callback", timeout=3)
        assert calls[0] - start >= 0.25
        stop.set()
        await asyncio.wait_for(task, 2)
    asyncio.run(scenario())


# -- the publisher coalesces health-driven writes ----------------------------------------------------------------------
def sick(n: int, *which: int) -> list[SliceDevice]:
    """``n`` devices, ``which`` tainted and with a port state attribute that says so (as the EFA profile's)."""
    return [dataclasses.replace(d, attributes={**d.attributes, "portState": "DOWN" if i in which else "ACTIVE"})
            for i, d in enumerate(devices(n, tainted=which))]


def test_a_flapping_taint_is_written_at_most_once_per_interval_with_the_latest_state() -> None:
    async def scenario(pub: SlicePublisher, api: FakeApi) -> None:
        await watching(api)
        pub.set_devices(sick(4))
        await asyncio.wait_for(pub.published.wait(), 5)
        assert len(api.writes) == 1, "the first write goes out at once"
        for i in range(10):  # 2 s of a port flapping every 0.2 s
            pub.set_devices(sick(4, 0) if i % 2 == 0 else sick(4))
            await asyncio.sleep(0.2)
        pub.set_devices(sick(4, 0))
        await asyncio.sleep(0.1)
        assert len(api.writes) == 1, "health-only changes wait for the interval"
        await until(lambda: len(api.writes) == 2, "the coalesced write", timeout=5)
        (obj,) = api.ours()
        assert [d.get("taints") is not None for d in obj["spec"]["devices"]] == [True, False, False, False], \
            "the latest state"
        assert obj["spec"]["devices"][0]["attributes"]["portState"] == {"string": "DOWN"}
        pub.set_devices(sick(5, 0))  # a device added: not health only, at once
        await until(lambda: len(api.writes) == 3, "the structural write", timeout=1)
    run_with(FakeApi(), scenario, min_write_interval=3.0)


def test_without_an_interval_every_health_change_is_written() -> None:
    async def scenario(pub: SlicePublisher, api: FakeApi) -> None:
        await watching(api)
        pub.set_devices(sick(2))
        await asyncio.wait_for(pub.published.wait(), 5)
        for i in range(6):
            pub.set_devices(sick(2, 0) if i % 2 == 0 else sick(2))
            await asyncio.wait_for(pub.published.wait(), 5)
        assert len(api.writes) == 7
    run_with(FakeApi(), scenario)


def test_the_first_listing_hands_the_servers_taints_over_before_any_write() -> None:
    api = FakeApi()
    seen: list[dict[str, tuple[Taint, ...]]] = []

    async def first(pub: SlicePublisher, api: FakeApi) -> None:
        pub.set_devices([*devices(1), SliceDevice("dev-1", taints=(Taint(KEY, "PortDown", "NoExecute",
                                                                            at(T0)),))])
        await asyncio.wait_for(pub.published.wait(), 5)

    async def second(pub: SlicePublisher, api: FakeApi) -> None:
        await until(lambda: bool(seen), "the hook")
        assert pub.writes == 0

    run_with(api, first)
    run_with(api, second, on_listed=seen.append)
    assert seen == [{"dev-1": (Taint(KEY, "PortDown", "NoExecute", at(T0)),)}]


# -- settings -------------------------------------------------------------------------------------------------------
def test_noexecute_after_and_write_interval_settings(monkeypatch: pytest.MonkeyPatch,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.delenv("UNHEALTHY_NOEXECUTE_AFTER", raising=False)
    monkeypatch.delenv("MIN_SLICE_WRITE_INTERVAL", raising=False)
    args = CLI.parser().parse_args(["serve"])
    assert (args.noexecute_after, args.min_slice_write_interval) == (30, 5)
    monkeypatch.setenv("UNHEALTHY_NOEXECUTE_AFTER", "90")
    monkeypatch.setenv("MIN_SLICE_WRITE_INTERVAL", "0")
    args = CLI.parser().parse_args(["serve"])
    assert (args.noexecute_after, args.min_slice_write_interval) == (90, 0)
    args = CLI.parser().parse_args(["serve", "--noexecute-after", "0"])
    assert args.noexecute_after == 0, "a flag wins over its variable"
    with pytest.raises(SystemExit):
        CLI.parser().parse_args(["serve", "--noexecute-after", "-5"])
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert "--noexecute-after" in last and "must be 0 (off) or more seconds, not -5" in last
