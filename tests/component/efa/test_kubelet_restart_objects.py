"""Issue 25 item 9 (guard): across kubelet restarts the device plugin's live structures stay flat: asyncio tasks,
gRPC servers and channels, and Python objects by type (bench/bench_kubelet_restarts.py gives the RSS figures)."""

from __future__ import annotations

import asyncio
import gc
import logging
from collections import Counter
from pathlib import Path

from accel_rig.kubelet_standin import KubeletStandIn
from hostcache import copy_host

from accel_core.deviceplugin.daemon import DevicePluginService
from efa_plugin import RESOURCE_NAME
from efa_plugin.daemon import PLUGIN


def abc_cache_parts(objects: list[object]) -> set[int]:
    """Ids of the objects that make up the ABCs' subclass caches. The first isinstance() of a new type against an ABC
    (say a generator against Mapping) fills a negative-cache set in Mapping and in every subclass of it, each set with
    a weakref to itself and per entry a weakref plus its callback: once per (ABC, type) pair, bounded by the number of
    types, and it happens whenever some code path first meets that type, which may be mid-measurement."""
    parts: set[int] = set()
    for data in objects:
        if type(data).__name__ != "_abc_data":
            continue
        for cache in gc.get_referents(data):
            if type(cache) is not set:
                continue
            parts.add(id(cache))
            for entry in cache:
                parts.add(id(entry))
                callback = getattr(entry, "__callback__", None)
                if callback is not None:
                    parts.update((id(callback), id(getattr(callback, "__self__", None))))
    return parts


def live() -> Counter[str]:
    """Live objects by type (exact type names: an isinstance() against an ABC such as grpc.aio.Server on every
    object would itself grow the ABC's caches), with gRPC servers, channels and asyncio tasks named."""
    gc.collect()
    objects = gc.get_objects()
    caches = abc_cache_parts(objects)
    out = Counter(f"{type(o).__module__}.{type(o).__qualname__}" for o in objects if id(o) not in caches)
    # asyncio drops cancelled timers from its heap lazily: only once more than 100 are scheduled and over half of
    # them are cancelled (base_events._MIN_SCHEDULED_TIMER_HANDLES, _MIN_CANCELLED_TIMER_HANDLES_FRACTION), so up to
    # ~100 dead TimerHandles, each holding its copied Context, sit there by design: a bounded sawtooth, not growth.
    scheduled: list[asyncio.TimerHandle] = asyncio.get_running_loop()._scheduled  # type: ignore[attr-defined]
    dead = len([h for h in scheduled if h.cancelled()])
    out["asyncio.events.TimerHandle"] -= dead
    out["_contextvars.Context"] -= dead
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
        task = asyncio.create_task(DevicePluginService(PLUGIN, standin.paths(host_root=host.root),
                                                       retry_interval=0.05).run(stop))

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
