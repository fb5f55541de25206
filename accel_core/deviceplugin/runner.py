"""Run one or more device-plugin servers that share one host watcher.

On every host change (inotify/udev event or the slow periodic rescan) the driver's ``rediscover`` re-reads the
host, then every server re-reads its policy's device list and streams it if it changed. Between rescans, a fast
poll (an event-loop timer, :class:`~accel_core.healthpoll.PollTimer`) re-reads only the few files that carry
health and have no change event on real sysfs (``health_files``); when one of them changed, that counts as a host
change. With a :class:`~accel_core.deviceplugin.handover.DraHandover`, each pass also re-reads the coexistence rule
and what DRA claims hold, and the watcher is woken when the rule may change with no file event (a lease ends).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

from accel_core.deviceplugin.handover import DraHandover
from accel_core.deviceplugin.pluginserver import DevicePluginServer
from accel_core.healthpoll import FilePoller, PollTimer
from accel_core.logs import kv
from accel_core.watch import ChangeWatcher

log = logging.getLogger(__name__)


async def serve_device_plugins(
    servers: Sequence[DevicePluginServer],
    rediscover: Callable[[], None],
    watch_paths: Callable[[], Iterable[Path]],
    stop: asyncio.Event,
    *,
    rescan_interval: float = 5.0,
    udev_subsystems: Iterable[str] = (),
    extra_refresh: Callable[[], None] | None = None,
    health_files: Callable[[], Iterable[Path]] | None = None,
    poll_interval: float | None = None,
    handover: DraHandover | None = None,
) -> None:
    """Serve until ``stop``; ``rediscover`` must not raise for bad host files (it logs and degrades instead)."""
    tasks = [s.start(stop) for s in servers]  # already running when started early (register_first)
    poller = FilePoller()
    if health_files is not None:
        poller.watch(health_files())
    watcher = ChangeWatcher(watch_paths, rescan_interval=rescan_interval, udev_subsystems=udev_subsystems)
    timer = None
    if health_files is not None and poll_interval is not None:
        timer = PollTimer(poller, poll_interval, lambda: watcher.kick("health"))
    recheck: asyncio.TimerHandle | None = None
    if handover is not None:
        for server in servers:
            server.held = handover.held
    async with watcher:
        if timer is not None:
            timer.start()
        try:
            async for reason in watcher.changes(stop, tasks=tasks):
                try:
                    rediscover()
                    if extra_refresh is not None:
                        extra_refresh()
                except Exception:
                    log.exception("host rescan failed; keeping the previous device list", extra=kv(reason=reason))
                    continue
                if health_files is not None:
                    poller.watch(health_files())
                if handover is not None:
                    await handover.refresh()
                    if recheck is not None:
                        recheck.cancel()
                    delay = handover.recheck_in()
                    recheck = (asyncio.get_running_loop().call_later(delay, watcher.kick, "coexistence")
                               if delay is not None else None)
                for server in servers:
                    await server.refresh()
            for task in tasks:
                if task.done() and not task.cancelled() and task.exception() is not None:
                    raise task.exception()  # type: ignore[misc]
        finally:
            if timer is not None:
                timer.cancel()
            if recheck is not None:
                recheck.cancel()
            poller.close()
            stop.set()
            for task in tasks:
                with contextlib.suppress(asyncio.CancelledError):
                    await task
