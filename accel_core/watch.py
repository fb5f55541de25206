"""Change watching: inotify events on host paths (and udev events on a real host), with a slow periodic rescan.

Consumers ask for the next change and re-read what they care about; the watcher never parses files. Paths that do
not exist yet are re-armed on every wake-up, so a device directory that appears later is watched from then on.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from asyncinotify import Inotify, Mask

from accel_core.logs import kv

log = logging.getLogger(__name__)

WATCH_MASK = (
    Mask.CREATE | Mask.DELETE | Mask.MODIFY | Mask.MOVED_TO | Mask.MOVED_FROM | Mask.CLOSE_WRITE
    | Mask.DELETE_SELF | Mask.MOVE_SELF | Mask.ATTRIB
)
MAX_WATCHES = 4096


class ChangeWatcher:
    """Wake up on a change under any of ``paths`` (recursively to ``depth``), or every ``rescan_interval`` seconds.

    ``paths_fn`` is called on every wake-up to get the current list, so the watch set follows the inventory.
    """

    def __init__(
        self,
        paths_fn: Callable[[], Iterable[Path]],
        *,
        rescan_interval: float = 10.0,
        debounce: float = 0.05,
        depth: int = 2,
        udev_subsystems: Iterable[str] = (),
    ) -> None:
        self._paths_fn = paths_fn
        self._rescan = rescan_interval
        self._debounce = debounce
        self._depth = depth
        self._udev_subsystems = tuple(udev_subsystems)
        self._inotify: Inotify | None = None
        self._watched: dict[str, Any] = {}
        self._kick = asyncio.Event()
        self._reason = ""
        self._tasks: list[asyncio.Task[None]] = []
        self._udev_monitor: Any = None

    async def __aenter__(self) -> ChangeWatcher:
        self._inotify = Inotify()
        self._tasks.append(asyncio.create_task(self._pump_inotify()))
        self._start_udev()
        self._arm()
        return self

    async def __aexit__(self, *exc: object) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        if self._udev_monitor is not None:
            with contextlib.suppress(Exception):
                asyncio.get_running_loop().remove_reader(self._udev_monitor.fileno())
        if self._inotify is not None:
            self._inotify.close()

    def kick(self, reason: str = "manual") -> None:
        """Wake the consumer now (for callers that learn of a change some other way)."""
        self._reason = reason
        self._kick.set()

    async def next_change(self) -> str:
        """Wait for the next change (debounced) or the rescan timeout; returns the reason."""
        try:
            await asyncio.wait_for(self._kick.wait(), timeout=self._rescan)
            await asyncio.sleep(self._debounce)  # let a burst of writes land before the consumer reads
            reason = self._reason or "event"
        except TimeoutError:
            reason = "rescan"
        self._kick.clear()
        self._reason = ""
        self._arm()
        return reason

    # -- inotify -------------------------------------------------------------------------------------------------
    def _arm(self) -> None:
        if self._inotify is None:
            return
        wanted: set[str] = set()
        for root in self._paths_fn():
            for path in self._walk(Path(root), self._depth):
                wanted.add(path)
        for stale in set(self._watched) - wanted:
            watch = self._watched.pop(stale)
            with contextlib.suppress(Exception):
                self._inotify.rm_watch(watch)
        for path in sorted(wanted - set(self._watched)):
            if len(self._watched) >= MAX_WATCHES:
                log.warning("too many paths to watch; relying on the periodic rescan for the rest",
                            extra=kv(limit=MAX_WATCHES))
                break
            try:
                self._watched[path] = self._inotify.add_watch(path, WATCH_MASK)
            except OSError:
                continue  # vanished between listing and watching: the next wake-up re-arms

    @staticmethod
    def _walk(root: Path, depth: int) -> Iterable[str]:
        if not root.exists():
            # watch the nearest existing parent so the path's creation wakes us
            parent = root.parent
            while parent != parent.parent and not parent.exists():
                parent = parent.parent
            if parent.exists():
                yield str(parent)
            return
        if not root.is_dir():
            yield str(root.parent)
            return
        yield str(root)
        if depth <= 0:
            return
        try:
            entries = list(os.scandir(root))
        except OSError:
            return
        for entry in entries:
            try:
                if entry.is_dir():  # follows symlinks, like sysfs class links
                    yield from ChangeWatcher._walk(Path(entry.path), depth - 1)
            except OSError:
                continue

    async def _pump_inotify(self) -> None:
        assert self._inotify is not None
        async for event in self._inotify:
            if event.mask & Mask.IGNORED:
                # the watched path went away: forget it so the next arm re-adds it when it comes back
                for path, watch in list(self._watched.items()):
                    if watch is event.watch:
                        self._watched.pop(path, None)
            self.kick(f"inotify:{event.path}")

    # -- udev (real hosts only) ------------------------------------------------------------------------------------
    def _start_udev(self) -> None:
        if not self._udev_subsystems:
            return
        try:
            import pyudev

            context = pyudev.Context()
            monitor = pyudev.Monitor.from_netlink(context)
            for subsystem in self._udev_subsystems:
                monitor.filter_by(subsystem)
            monitor.start()
        except Exception as exc:  # no udev netlink (container, non-Linux): inotify + rescan still work
            log.info("udev monitor unavailable; using inotify and rescans", extra=kv(error=exc))
            return

        def on_readable() -> None:
            device = monitor.poll(timeout=0)
            while device is not None:
                self.kick(f"udev:{device.action}:{device.sys_name}")
                device = monitor.poll(timeout=0)

        asyncio.get_running_loop().add_reader(monitor.fileno(), on_readable)
        self._udev_monitor = monitor
