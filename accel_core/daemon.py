"""Run a daemon's main coroutine on one event loop until SIGTERM or SIGINT, then let it clean up."""

from __future__ import annotations

import asyncio
import gc
import logging
import signal
import sys
from collections.abc import Awaitable, Callable

from accel_core.instancelock import InstanceConflict
from accel_core.logs import kv
from accel_core.paths import SocketPathError

log = logging.getLogger(__name__)

GIL_SWITCH_INTERVAL_S = 0.0005


def run_daemon(main: Callable[[asyncio.Event], Awaitable[None]], name: str) -> int:
    """Call ``main(stop)``; ``stop`` is set on SIGTERM/SIGINT. Returns the process exit code."""

    async def runner() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()

        def on_signal(sig: signal.Signals) -> None:
            log.info("stopping", extra=kv(daemon=name, signal=sig.name))
            stop.set()

        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, on_signal, sig)
        await main(stop)

    # Everything imported and built so far lives for the whole run: keep the collector from re-scanning it, which
    # otherwise shows up as millisecond pauses in RPC latency (p99) on a long-running daemon.
    gc.collect()
    gc.freeze()
    # Blocking file work (fsync'd checkpoint and CDI writes) runs in worker threads; with the default 5 ms switch
    # interval every hand-over of the GIL between such a thread and the event loop could wait up to 5 ms, which made
    # a DRA prepare 4x slower than its work (bench/bench_compare.py). Short hand-overs cost nothing measurable here.
    sys.setswitchinterval(GIL_SWITCH_INTERVAL_S)
    try:
        asyncio.run(runner())
    except KeyboardInterrupt:
        return 130
    except SocketPathError as exc:
        log.error("cannot serve: shorten the directory flags", extra=kv(daemon=name, error=exc))
        return 2
    except InstanceConflict as exc:
        log.error(f"not starting: {exc}", extra=kv(daemon=name))
        return 2
    return 0
