"""ChangeWatcher: inotify wake-ups, paths that appear later, and the periodic rescan."""

from __future__ import annotations

import asyncio
import shutil
from pathlib import Path

from accel_core.watch import ChangeWatcher


def test_event_rescan_and_late_paths(tmp_path: Path) -> None:
    watched = tmp_path / "sys" / "class" / "thing"

    async def scenario() -> None:
        async with ChangeWatcher(lambda: [watched], rescan_interval=0.3, debounce=0.01, depth=1) as watcher:
            assert await watcher.next_change() == "rescan", "nothing happened: the slow rescan fires"
            watched.mkdir(parents=True)  # a path that did not exist: its nearest parent was watched
            assert (await asyncio.wait_for(watcher.next_change(), 2)).startswith("inotify:")
            (watched / "dev0").mkdir()
            await asyncio.wait_for(watcher.next_change(), 2)
            (watched / "dev0" / "state").write_text("4: ACTIVE\n")  # depth 1: files inside dev0 are seen
            assert (await asyncio.wait_for(watcher.next_change(), 2)).startswith("inotify:")
            watcher.kick("test")
            assert await watcher.next_change() == "test"

    asyncio.run(scenario())


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
            (watched / "dev0" / "state").write_text("1\n")
            await asyncio.wait_for(_until(watcher, "dev0/state"), 5)
            shutil.rmtree(watched)
            await asyncio.wait_for(_until(watcher, "thing"), 5)
            (watched / "dev0").mkdir(parents=True)  # back again, under a new inode
            await asyncio.wait_for(_until(watcher, "thing"), 5)
            (watched / "dev0" / "state").write_text("2\n")  # seen only if the new directories were watched again
            await asyncio.wait_for(_until(watcher, "dev0/state"), 5)

    asyncio.run(scenario())
