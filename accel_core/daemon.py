"""Run a daemon's main coroutine on one event loop until SIGTERM, SIGINT or SIGHUP, then let it clean up.

SIGHUP is a clean stop like SIGTERM (no reload: a daemon's settings are its flags and environment, so a restart
by the DaemonSet is the reload). A daemon calls :func:`catch_stop_signals` first thing on its serve path: from
then on a stop signal is remembered instead of killing the process, so it can never die between creating a
socket and removing it; :func:`run_daemon` acts on a remembered one at once.

A main that fails still stops like a clean stop: ``stop`` is set and what it started (gRPC servers and their
streams) gets :data:`SETTLE_S` to finish before the loop cancels the rest. Cancelling gRPC's own tasks mid-call and
closing the loop under its poller thread crashed the interpreter (SIGSEGV, no error line) in about one start of
five of a Neuron device plugin that failed after it had registered.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import signal
import sys
from collections.abc import Awaitable, Callable

from accel_core.grpc_runtime import hold_grpc_runtime
from accel_core.instancelock import InstanceConflict, LockPathError
from accel_core.logs import kv
from accel_core.paths import SocketPathError

log = logging.getLogger(__name__)

GIL_SWITCH_INTERVAL_S = 0.0005
#: seconds the tasks a failed main leaves running get to end after ``stop`` is set (a device plugin's servers stop
#: in 0.2 s), before the loop cancels what is left
SETTLE_S = 5.0
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)

_caught: list[signal.Signals] = []


def catch_stop_signals() -> None:
    """Remember SIGTERM, SIGINT and SIGHUP from now on instead of dying of them (until :func:`run_daemon`'s loop
    takes them over): call it before anything that creates a socket."""
    for sig in STOP_SIGNALS:
        signal.signal(sig, _remember)


def _remember(signum: int, frame: object) -> None:
    _caught.append(signal.Signals(signum))


def run_daemon(main: Callable[[asyncio.Event], Awaitable[None]], name: str, *, serves_grpc: bool = False) -> int:
    """Call ``main(stop)``; ``stop`` is set on SIGTERM/SIGINT/SIGHUP. Returns the process exit code. A daemon that
    ``serves_grpc`` keeps gRPC's runtime up from start to stop (:mod:`accel_core.grpc_runtime`)."""
    catch_stop_signals()  # a no-op for a daemon that did it earlier; the loop's handlers replace these
    log.info("running; SIGTERM, SIGINT and SIGHUP stop it cleanly", extra=kv(daemon=name))
    if _caught:  # a stop signal came while starting: nothing is served yet, nothing to clean up
        log.info("stopping before serving", extra=kv(daemon=name, signal=_caught[0].name))
        return 0

    async def runner() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()

        def on_signal(sig: signal.Signals) -> None:
            log.info("stopping", extra=kv(daemon=name, signal=sig.name))
            stop.set()

        for sig in STOP_SIGNALS:
            loop.add_signal_handler(sig, on_signal, sig)
        if _caught:  # between the check above and the loop's handlers
            on_signal(_caught[0])
        async with hold_grpc_runtime() if serves_grpc else contextlib.nullcontext():
            try:
                await main(stop)
            except BaseException:
                await _settle(stop)
                raise

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
    except (InstanceConflict, LockPathError) as exc:
        log.error(f"not starting: {exc}", extra=kv(daemon=name))
        return 2
    return 0


async def _settle(stop: asyncio.Event) -> None:
    """Set ``stop`` and give the other tasks :data:`SETTLE_S` to end by themselves (servers stop their gRPC)."""
    stop.set()
    others = asyncio.all_tasks() - {asyncio.current_task()}
    if others:
        await asyncio.wait(others, timeout=SETTLE_S)
