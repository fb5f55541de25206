"""ChangeWatcher: inotify wake-ups, paths that appear later, the periodic rescan, the poll tick and the ``changes``
iterator; ``wake``; the health-file poller."""

from __future__ import annotations

import asyncio
import os
import shutil
from pathlib import Path

from accel_core.healthpoll import FilePoller
from accel_core.watch import EVENT, STOP, TASK, TIMEOUT, ChangeWatcher, wake


def test_event_rescan_and_late_paths(tmp_path: Path) -> None:
    watched = tmp_path / "sys" / "class" / "thing"

    async def scenario() -> None:
        async with ChangeWatcher(lambda: [watched], rescan_interval=0.3, debounce=0.01, depth=1) as watcher:
            assert await watcher.next_change() == "armed"
            assert await watcher.next_change() == "rescan", "nothing happened: the slow rescan fires"
            # the 0.3 s rescan keeps firing: on a loaded machine one may come before an event, so rescans are
            # skipped (an event that never came still fails: a rescan is not an inotify wake-up)
            watched.mkdir(parents=True)  # a path that did not exist: its nearest parent was watched
            assert (await asyncio.wait_for(_not_rescan(watcher), 10)).startswith("inotify:")
            (watched / "dev0").mkdir()
            await asyncio.wait_for(_not_rescan(watcher), 10)
            (watched / "dev0" / "state").write_text("4: ACTIVE\n")  # depth 1: files inside dev0 are seen
            assert (await asyncio.wait_for(_not_rescan(watcher), 10)).startswith("inotify:")
            watcher.kick("test")
            assert await asyncio.wait_for(_not_rescan(watcher), 10) == "test"

    asyncio.run(scenario())


async def _not_rescan(watcher: ChangeWatcher) -> str:
    """The next wake-up that is not the periodic rescan."""
    while (reason := await watcher.next_change()) == "rescan":
        pass
    return reason


async def _until(watcher: ChangeWatcher, suffix: str) -> str:
    """Wake-ups until one names a path ending in ``suffix`` (earlier events of the same change may come first)."""
    while True:
        reason = await watcher.next_change()
        assert reason.startswith("inotify:"), f"woken by {reason!r}, not by inotify"
        if reason.endswith(suffix):
            return reason


def test_rearms_after_the_watched_directory_is_deleted_and_recreated(tmp_path: Path) -> None:
    watched = tmp_path / "sys" / "class" / "thing"
    (watched / "dev0").mkdir(parents=True)

    async def scenario() -> None:
        # the rescan is far away: every wake-up below must come from an inotify watch
        async with ChangeWatcher(lambda: [watched], rescan_interval=3600, debounce=0.01, depth=1) as watcher:
            assert await watcher.next_change() == "armed"
            (watched / "dev0" / "state").write_text("1\n")
            await asyncio.wait_for(_until(watcher, "dev0/state"), 20)
            shutil.rmtree(watched)
            await asyncio.wait_for(_until(watcher, "thing"), 20)
            (watched / "dev0").mkdir(parents=True)  # back again, under a new inode
            await asyncio.wait_for(_until(watcher, "thing"), 20)
            (watched / "dev0" / "state").write_text("2\n")  # seen only if the new directories were watched again
            await asyncio.wait_for(_until(watcher, "dev0/state"), 20)

    asyncio.run(scenario())


def test_a_change_before_the_watches_exist_is_not_lost(tmp_path: Path) -> None:
    """A daemon reads the host, then arms its watches: a device that appeared in between raised no event it could
    see. A consumer that re-reads on every wake-up (as the daemons do) sees it at its first wake-up, right after
    arming: not at an event (there is none) nor a rescan (an hour away)."""
    state = tmp_path / "state"
    state.write_text("absent\n")

    async def scenario() -> list[tuple[str, str]]:
        seen = state.read_text()  # the daemon's first read of the host
        state.write_text("present\n")  # the change, before any watch exists
        woken: list[tuple[str, str]] = []
        stop = asyncio.Event()
        async with ChangeWatcher(lambda: [tmp_path], rescan_interval=3600, debounce=0.01, depth=0) as watcher:
            async for reason in watcher.changes(stop):
                seen = state.read_text()
                woken.append((reason, seen))
                if seen == "present\n":
                    stop.set()
        return woken

    assert asyncio.run(asyncio.wait_for(scenario(), 30)) == [("armed", "present\n")]


def test_wake_says_what_happened() -> None:
    async def scenario() -> None:
        stop, event = asyncio.Event(), asyncio.Event()
        assert await wake(stop, event, timeout=0.01) == TIMEOUT
        event.set()
        assert await wake(stop, event, timeout=5) == EVENT
        event.clear()
        task = asyncio.ensure_future(asyncio.sleep(0))
        assert await wake(stop, event, timeout=5, tasks=[task]) == TASK
        stop.set()
        event.set()
        assert await wake(stop, event, timeout=5) == STOP, "stop wins over everything else"
        assert len(asyncio.all_tasks()) == 1, "wake leaves no waiter behind"

    asyncio.run(scenario())


def test_changes_iterates_until_stop_and_polls_without_events(tmp_path: Path) -> None:
    async def scenario() -> None:
        stop = asyncio.Event()
        reasons: list[str] = []
        async with ChangeWatcher(lambda: [tmp_path], rescan_interval=0.6, poll_interval=0.05,
                                 debounce=0.01, depth=0) as watcher:
            async for reason in watcher.changes(stop):
                reasons.append(reason)
                if reason == "poll" and reasons.count("poll") == 2:
                    (tmp_path / "state").write_text("DOWN\n")
                if reason.startswith("inotify:"):
                    stop.set()  # the iteration ends at once, even though the next wait has begun
        polls = [r for r in reasons if r != "rescan"]  # a loaded machine may fit the 0.6 s rescan in between
        assert polls[:3] == ["armed", "poll", "poll"], reasons
        assert any(r.startswith("inotify:") for r in reasons), reasons

    asyncio.run(asyncio.wait_for(scenario(), 10))


def test_file_poller_sees_content_changes_and_never_blocks(tmp_path: Path) -> None:
    state, fifo, later = tmp_path / "state", tmp_path / "fifo", tmp_path / "later"
    state.write_text("4: ACTIVE\n")
    os.mkfifo(fifo)  # a planted FIFO must not stall the poll (no writer ever opens it)
    poller = FilePoller()
    poller.watch([state, fifo, later])
    try:
        assert not poller.changed()
        state.write_text("1: DOWN\n")  # in place, as sysfs attributes change
        assert poller.changed()
        assert not poller.changed(), "the new content is the baseline now"
        later.write_text("x\n")
        assert poller.changed(), "a file missing at watch() time is opened once it exists"
        assert not poller.changed()
        state.unlink()
        state.write_text("4: ACTIVE\n")  # a new file under the old name: seen once watch() re-opens (rescan)
        assert not poller.changed(), "the poller still reads the old file"
        poller.watch([state, fifo, later])
        assert poller.changed(), "compared with what the last poll read, not with what the rescan saw"
        assert not poller.changed()
        state.write_text("1: DOWN\n")
        assert poller.changed()
    finally:
        poller.close()
