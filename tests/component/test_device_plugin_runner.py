"""The device-plugin runner rescans the host in a worker thread, never on the event loop (which answers the
kubelet), and runs ``extra_refresh`` (what touches asyncio objects) back on the loop."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path

from accel_core.deviceplugin.runner import serve_device_plugins


def test_rescans_run_off_the_loop_and_extra_refresh_on_it(tmp_path: Path) -> None:
    started, release = threading.Event(), threading.Event()
    released_in_time: list[bool] = []
    refresh_threads: list[int] = []

    def rediscover() -> None:  # blocks until the loop answers: only possible if the loop is not the one blocked
        started.set()
        released_in_time.append(release.wait(5))

    async def scenario() -> int:
        stop = asyncio.Event()
        task = asyncio.create_task(serve_device_plugins(
            [], rediscover, lambda: [tmp_path], stop, rescan_interval=60,
            extra_refresh=lambda: refresh_threads.append(threading.get_ident())))
        for _ in range(500):
            if started.is_set():
                break
            await asyncio.sleep(0.01)
        release.set()  # the loop runs this while the rescan is under way
        for _ in range(500):
            if refresh_threads:
                break
            await asyncio.sleep(0.01)
        stop.set()
        await asyncio.wait_for(task, 10)
        return threading.get_ident()

    loop_thread = asyncio.run(scenario())
    assert started.is_set(), "no rescan at start"
    assert released_in_time[:1] == [True], "the rescan blocked the event loop"
    assert refresh_threads[:1] == [loop_thread], "extra_refresh did not run on the event loop"
