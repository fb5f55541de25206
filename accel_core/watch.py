"""Change watching: inotify events on host paths (and udev events on a real host), with a slow periodic rescan and
an optional fast poll tick; and :func:`wake`, the one "wait for a change, a timeout or stop" every daemon loop uses.

Consumers iterate :meth:`ChangeWatcher.changes` and re-read what they care about; the watcher never parses files.
The watch set is re-armed after every event and on the slow rescan (not on poll ticks, which must stay cheap), so a
device directory that appears later is watched from then on: a path that does not exist yet is covered by a watch
on its nearest existing parent.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import AsyncIterator, Callable, Iterable
from pathlib import Path
from typing import Any

from asyncinotify import Inotify, Mask

from accel_core.healthpoll import FilePoller, PollTimer
from accel_core.logs import kv

log = logging.getLogger(__name__)

WATCH_MASK = (
    Mask.CREATE | Mask.DELETE | Mask.MODIFY | Mask.MOVED_TO | Mask.MOVED_FROM | Mask.CLOSE_WRITE
    | Mask.DELETE_SELF | Mask.MOVE_SELF | Mask.ATTRIB
)
MAX_WATCHES = 4096

#: What :func:`wake` returns.
STOP, EVENT, TIMEOUT, TASK = "stop", "event", "timeout", "task"


async def wake(
    stop: asyncio.Event,
    event: asyncio.Event | None = None,
    *,
    timeout: float | None = None,
    tasks: Iterable[asyncio.Future[Any]] = (),
) -> str:
    """Wait until ``stop`` is set, ``event`` is set, ``timeout`` seconds pass or one of ``tasks`` finishes.

    Returns :data:`STOP`, :data:`EVENT`, :data:`TIMEOUT` or :data:`TASK` (stop wins over the rest when several
    happen at once). Neither event is cleared and no task is cancelled; the helper's own waiters are.
    """
    if stop.is_set():
        return STOP
    waiters: list[asyncio.Future[Any]] = [asyncio.ensure_future(stop.wait())]
    if event is not None:
        waiters.append(asyncio.ensure_future(event.wait()))
    pending = {*waiters, *tasks}
    try:
        await asyncio.wait(pending, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for waiter in waiters:
            waiter.cancel()
        await asyncio.gather(*waiters, return_exceptions=True)
    if stop.is_set():
        return STOP
    if event is not None and event.is_set():
        return EVENT
    if any(t.done() for t in tasks):
        return TASK
    return TIMEOUT


class ChangeWatcher:
    """Wake up on a change under any of ``paths`` (recursively to ``depth``), every ``rescan_interval`` seconds
    (reason ``"rescan"``) and, when ``poll_interval`` is given, on a fast tick (reason ``"poll"``) for consumers that
    must read a few files without change events (sysfs port state, error counters).

    ``paths_fn`` is called after every event and rescan to get the current list, so the watch set follows the
    inventory.

    The first wake-up (reason ``"armed"``) comes as soon as the watches are in place: what changed between the
    consumer's first read of the host and the arming raised no event.
    """

    def __init__(
        self,
        paths_fn: Callable[[], Iterable[Path]],
        *,
        rescan_interval: float = 10.0,
        poll_interval: float | None = None,
        debounce: float = 0.05,
        depth: int = 2,
        udev_subsystems: Iterable[str] = (),
    ) -> None:
        self._paths_fn = paths_fn
        self._rescan = rescan_interval
        self.poll_interval = poll_interval  #: may be changed between wake-ups (None: no poll tick)
        self._next_rescan = 0.0
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
        self._next_rescan = asyncio.get_running_loop().time() + self._rescan
        # whatever changed between the consumer's first read and this arming raised no event we can see: the first
        # wake-up comes at once, so the consumer reads again with the watches in place
        self.kick("armed")
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
        """Wait for the next change (debounced), the rescan timeout or the poll tick; returns the reason."""
        reason = await self._next(asyncio.Event(), ())
        assert reason is not None
        return reason

    async def changes(self, stop: asyncio.Event, *, tasks: Iterable[asyncio.Future[Any]] = ()) -> AsyncIterator[str]:
        """Yield the reason of each change until ``stop`` is set or one of ``tasks`` finishes."""
        tasks = tuple(tasks)
        while (reason := await self._next(stop, tasks)) is not None:
            yield reason

    async def _next(self, stop: asyncio.Event, tasks: tuple[asyncio.Future[Any], ...]) -> str | None:
        """One wait (a single :func:`wake`: cheap enough for a poll tick twice a second); None on stop/task."""
        loop = asyncio.get_running_loop()
        timeout = max(0.0, self._next_rescan - loop.time())
        tick = "rescan"
        if self.poll_interval is not None and self.poll_interval < timeout:
            timeout, tick = self.poll_interval, "poll"
        woke = await wake(stop, self._kick, timeout=timeout, tasks=tasks)
        if woke in (STOP, TASK):
            return None
        if woke == EVENT:
            await asyncio.sleep(self._debounce)  # let a burst of writes land before the consumer reads
            reason = self._reason or "event"
        else:
            reason = tick
        self._kick.clear()
        self._reason = ""
        if reason != "poll":
            self._arm()
            self._next_rescan = loop.time() + self._rescan
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


@contextlib.asynccontextmanager
async def watching_host(paths_fn: Callable[[], Iterable[Path]], poller: FilePoller, *, rescan_interval: float,
                        health_poll_interval: float, udev_subsystems: Iterable[str] = (),
                        depth: int = 2) -> AsyncIterator[ChangeWatcher]:
    """A daemon's watch of its host: a :class:`ChangeWatcher` on ``paths_fn``, kicked ("health") whenever a poll
    of ``poller``'s files every ``health_poll_interval`` seconds sees one change; the poll stops and ``poller`` is
    closed at the end."""
    async with ChangeWatcher(paths_fn, rescan_interval=rescan_interval, depth=depth,
                             udev_subsystems=udev_subsystems) as watcher:
        timer = PollTimer(poller, health_poll_interval, lambda: watcher.kick("health"))
        timer.start()
        try:
            yield watcher
        finally:
            timer.cancel()
            poller.close()
