"""The idle-cost pacing: the health poll runs from a loop timer and wakes its consumer only on a change; the
Neuron PodResources poller lists fast only while something is held or pending."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from accel_rig.polling import until

from accel_core.healthpoll import FilePoller, PollTimer
from accel_core.watch import EVENT, STOP, wake
from neuron_dra.deviceplugin import podresources
from neuron_dra.deviceplugin.inuse import NEURON, NEURONCORE, UsageTracker
from neuron_dra.deviceplugin.podresources import PodResourcesPoller


def test_poll_timer_calls_back_only_after_a_change(tmp_path: Path) -> None:
    state = tmp_path / "state"
    state.write_text("4: ACTIVE\n")

    async def scenario() -> tuple[int, int]:
        poller = FilePoller()
        poller.watch([state])
        ticks = 0
        real_changed = poller.changed

        def counting() -> bool:
            nonlocal ticks
            ticks += 1
            return real_changed()

        poller.changed = counting  # type: ignore[method-assign]
        fired = asyncio.Event()
        timer = PollTimer(poller, 0.01, fired.set)
        timer.start()
        try:
            while ticks < 5:
                await asyncio.sleep(0.01)
            before = fired.is_set()  # five polls of unchanged content
            state.write_text("1: DOWN\n")
            await asyncio.wait_for(fired.wait(), 5)
            return int(before), ticks
        finally:
            timer.cancel()
            poller.close()

    before, ticks = asyncio.run(scenario())
    assert before == 0, "no callback while the content stays the same"
    assert ticks >= 6


def test_poll_timer_survives_a_failing_poll(tmp_path: Path) -> None:
    async def scenario() -> int:
        poller = FilePoller()
        calls = 0

        def broken() -> bool:
            nonlocal calls
            calls += 1
            raise OSError("boom")

        poller.changed = broken  # type: ignore[method-assign]
        timer = PollTimer(poller, 0.005, lambda: None)
        timer.start()
        while calls < 3:
            await asyncio.sleep(0.005)
        timer.cancel()
        return calls

    assert asyncio.run(scenario()) >= 3


def test_a_change_between_rescan_and_re_watch_still_counts(tmp_path: Path) -> None:
    """A daemon rescans, then re-watches: a counter rising in between must show at the next poll, not wait for the
    next full rescan."""
    counter, state = tmp_path / "total", tmp_path / "state"
    counter.write_text("0\n")
    state.write_text("4: ACTIVE\n")
    poller = FilePoller()
    try:
        poller.watch([counter])
        counter.write_text("1\n")  # after the rescan read it, before the re-watch
        poller.watch([counter, state])  # a device came: its file starts from what it holds now
        assert poller.changed(), "the rise was seen"
        assert not poller.changed(), "and only once"
        state.write_text("1: DOWN\n")
        assert poller.changed()
    finally:
        poller.close()


def _poller(usage: UsageTracker) -> PodResourcesPoller:
    async def make() -> PodResourcesPoller:  # the client's channel wants a running loop
        return PodResourcesPoller(Path("/nonexistent/kubelet.sock"), usage, lambda: None, interval=2.0,
                                  idle_interval=30.0)

    return asyncio.run(make())


def test_pod_resources_lists_slowly_only_when_nothing_can_be_freed() -> None:
    usage = UsageTracker(grace=30.0)
    poller = _poller(usage)
    assert poller.next_interval() == 2.0, "before the first List: nothing is known yet"
    usage.apply_list({})
    assert poller.next_interval() == 30.0, "nothing held, nothing pending"
    usage.record_allocate(NEURONCORE, ["4"])
    assert poller.next_interval() == 2.0, "an Allocate the List has not confirmed yet"
    usage.apply_list({NEURONCORE: ["4"]})
    assert poller.next_interval() == 2.0, "a held core can be freed any time"
    usage.apply_list({NEURON: [], NEURONCORE: []})
    assert poller.next_interval() == 30.0
    usage.list_failed()
    assert poller.next_interval() == 2.0, "a failing List is retried at the fast pace"


def test_idle_interval_is_never_shorter_than_the_busy_one() -> None:
    usage = UsageTracker()
    usage.apply_list({})

    async def make() -> PodResourcesPoller:
        return PodResourcesPoller(Path("/nonexistent/kubelet.sock"), usage, lambda: None, interval=5.0,
                                  idle_interval=1.0)

    assert asyncio.run(make()).next_interval() == 5.0


class RecordedWakes:
    """Stands in for the poller module's ``wake``: records each wait's timeout as it starts and its result."""

    def __init__(self) -> None:
        self.started: list[float | None] = []
        self.results: list[str] = []

    async def __call__(self, stop: asyncio.Event, event: asyncio.Event | None = None, *,
                       timeout: float | None = None) -> str:
        self.started.append(timeout)
        result = await wake(stop, event, timeout=timeout)
        self.results.append(result)
        return result


async def _loop_turns(count: int) -> None:
    """Let the event loop run ``count`` times (a woken wait returns within a few turns)."""
    for _ in range(count):
        await asyncio.sleep(0)


def _run_kicked(monkeypatch: pytest.MonkeyPatch, held: dict[str, list[str]]) -> RecordedWakes:
    """Start a poller whose every List leaves ``held`` in use, kick it once it waits after its first List, and
    stop it once the wait has ended or has had many loop turns to; the waits it made."""
    waits = RecordedWakes()
    monkeypatch.setattr(podresources, "wake", waits)

    async def scenario() -> None:
        usage = UsageTracker()
        poller = PodResourcesPoller(Path("/nonexistent/kubelet.sock"), usage, lambda: None, interval=10.0,
                                    idle_interval=30.0)
        real_poll = poller.poll_once

        async def poll() -> bool:
            await real_poll()  # fails (no socket) and marks the usage unknown: set what the test wants
            usage.apply_list(held)
            return True

        poller.poll_once = poll  # type: ignore[method-assign]
        stop = asyncio.Event()
        task = asyncio.create_task(poller.run(stop))
        await until(lambda: waits.started, "the poller's first wait")
        poller.kick()  # an Allocate
        for _ in range(50):
            await _loop_turns(1)
            if waits.results:
                break
        stop.set()
        await asyncio.wait_for(task, 5)

    asyncio.run(scenario())
    return waits


def test_an_allocate_ends_only_an_idle_wait(monkeypatch: pytest.MonkeyPatch) -> None:
    """kick() is how an Allocate reaches the poller: it must end a 30 s idle wait (then the poller follows at the
    fast pace), and wake nothing while the poller already lists at the fast pace."""
    idle = _run_kicked(monkeypatch, {})
    assert idle.started[0] == 30.0 and idle.results[0] == EVENT, "the Allocate ended the idle wait"
    assert idle.started[1] == 10.0, "then the fast pace, to see the new container's devices"
    busy = _run_kicked(monkeypatch, {NEURONCORE: ["4"]})
    assert busy.started == [10.0] and busy.results == [STOP], "the fast-pace wait ran on until stop"
