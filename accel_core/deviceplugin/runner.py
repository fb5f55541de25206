"""Run one or more device-plugin servers that share one host watcher.

On every host change (inotify/udev event or the periodic rescan) the driver's ``rediscover`` re-reads the host,
then every server re-reads its policy's device list and streams it if it changed.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

from accel_core.deviceplugin.server import DevicePluginServer
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
) -> None:
    """Serve until ``stop``; ``rediscover`` must not raise for bad host files (it logs and degrades instead)."""
    tasks = [asyncio.create_task(s.run(stop)) for s in servers]
    watcher = ChangeWatcher(watch_paths, rescan_interval=rescan_interval, udev_subsystems=udev_subsystems)
    stop_task = asyncio.create_task(stop.wait())
    async with watcher:
        try:
            while not stop.is_set():
                change = asyncio.create_task(watcher.next_change())
                await asyncio.wait({change, stop_task, *tasks}, return_when=asyncio.FIRST_COMPLETED)
                if stop.is_set():
                    change.cancel()
                    break
                for task in tasks:
                    if task.done() and task.exception() is not None:
                        raise task.exception()  # type: ignore[misc]
                if not change.done():
                    continue
                reason = change.result()
                try:
                    rediscover()
                    if extra_refresh is not None:
                        extra_refresh()
                except Exception:
                    log.exception("host rescan failed; keeping the previous device list", extra=kv(reason=reason))
                    continue
                for server in servers:
                    await server.refresh()
        finally:
            stop_task.cancel()
            stop.set()
            for task in tasks:
                with contextlib.suppress(asyncio.CancelledError):
                    await task
