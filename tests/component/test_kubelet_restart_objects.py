"""Issue 25 item 9 (guard): across kubelet restarts the device plugin's live structures stay flat: asyncio tasks,
gRPC servers and channels, and Python objects by type (bench/bench_kubelet_restarts.py gives the RSS figures)."""

from __future__ import annotations

import asyncio
import gc
import logging
from collections import Counter
from pathlib import Path

from hostcache import copy_host

from accel_core.devtools.kubelet_standin import KubeletStandIn
from efa_plugin import RESOURCE_NAME
from efa_plugin.cli import run_plugin


def live() -> Counter[str]:
    """Live objects by type (exact type names: an isinstance() against an ABC such as grpc.aio.Server on every
    object would itself grow the ABC's caches), with gRPC servers, channels and asyncio tasks named."""
    gc.collect()
    out = Counter(f"{type(o).__module__}.{type(o).__qualname__}" for o in gc.get_objects())
    out["grpc servers"] = out["grpc.aio._server.Server"]
    out["grpc channels"] = out["grpc.aio._channel.Channel"]
    out["tasks"] = len(asyncio.all_tasks())
    return out


def test_kubelet_restarts_leave_no_growing_structure(short_tmp: Path) -> None:
    async def scenario() -> None:
        host = copy_host(short_tmp / "h", "p4d.24xlarge")
        standin = KubeletStandIn(short_tmp / "k")
        await standin.start()
        stop = asyncio.Event()
        task = asyncio.create_task(run_plugin(standin.paths(host_root=host.root), stop, retry_interval=0.05))

        async def restarts(count: int) -> None:
            for _ in range(count):
                standin.registrations.clear()  # the stand-in's own record
                await standin.restart()
                await standin.wait_registered(RESOURCE_NAME)
                await standin.wait_devices(RESOURCE_NAME, lambda d: len(d) == 4)

        try:
            await standin.wait_registered(RESOURCE_NAME, timeout=30)
            logging.disable(logging.WARNING)  # pytest keeps every log record of a test: not the daemon's memory
            await restarts(20)
            before = live()
            await restarts(100)
            after = live()
            for key in ("tasks", "grpc servers", "grpc channels"):
                assert after[key] <= before[key], (key, before[key], after[key])
            grown = {k: after[k] - before[k] for k in after if after[k] - before[k] >= 50}
            assert grown == {}, f"object counts grew by half a restart's worth or more: {grown}"
        finally:
            logging.disable(logging.NOTSET)
            stop.set()
            await asyncio.wait_for(task, 10)
            await standin.stop()

    asyncio.run(scenario())
