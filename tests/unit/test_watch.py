"""ChangeWatcher: inotify wake-ups, paths that appear later, and the periodic rescan."""

from __future__ import annotations

import asyncio
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
