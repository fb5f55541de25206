"""Worker process of :mod:`bench_fleet_api`: many nodes' slice publishers (the drivers' own
:class:`accel_core.dra.publisher.SlicePublisher`, each with its own API client and so its own connections, built as
``neuron-dra-driver serve`` builds it) as asyncio tasks on one event loop, driven by commands on a pipe.

Commands: ``start`` (every publisher publishes the devices of a trn2.48xlarge node and keeps its watch; answers
when all have published), ``health`` (one device per node turns unhealthy; answers when all have republished),
``rollout`` (the publishers stop and new ones start, as the pods of a DaemonSet update: a new
``draDriverVersion``, devices healthy again), ``stop`` (publishers stop, slices stay; answers and exits). Each
answer, and the first message (ready), is ``(seconds, RSS bytes)``.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import resource
import time
from multiprocessing.connection import Connection

import psutil
from fleet_shapes import scan_devices

from accel_core.dra.cli import kube_client, kube_config
from accel_core.dra.devices import Taint, Version
from accel_core.dra.publisher import SlicePublisher
from accel_core.logs import setup_logging


def raise_fd_limit() -> None:
    """Each publisher holds a connection (its watch) and sometimes a second: lift the soft limit to the hard one."""
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


async def serve(conn: Connection, kubeconfig: str, nodes: list[str]) -> None:
    (kind,) = scan_devices("trn2.48xlarge", efa=False)
    sick = [dataclasses.replace(d, taints=(Taint(f"{kind.driver}/unhealthy", "EccUncorrected"),)) if i == 0 else d
            for i, d in enumerate(kind.devices)]
    updated = [dataclasses.replace(d, attributes={**d.attributes, "draDriverVersion": Version("99.0.0")})
               for d in kind.devices]
    config = kube_config(kubeconfig)
    stop = asyncio.Event()
    pubs: list[SlicePublisher] = []
    tasks: list[asyncio.Task[None]] = []
    conn.send((0.0, psutil.Process().memory_info().rss))  # ready

    async def stop_all() -> None:
        stop.set()
        await asyncio.gather(*tasks)
        for pub in pubs:
            with contextlib.suppress(Exception):
                await pub.client.close()

    while True:
        command = await asyncio.to_thread(conn.recv)
        t0 = time.perf_counter()
        if command in ("start", "rollout"):
            if pubs:
                await stop_all()
                stop = asyncio.Event()
            pubs = [SlicePublisher(kube_client(config, "neuron-dra-driver"), kind.driver, node) for node in nodes]
            for pub in pubs:
                pub.set_devices(kind.devices if command == "start" else updated, kind.counters)
            tasks = [asyncio.create_task(pub.run(stop)) for pub in pubs]
        elif command == "health":
            for pub in pubs:
                pub.set_devices(sick, kind.counters)
        elif command == "stop":
            await stop_all()
            conn.send((time.perf_counter() - t0, psutil.Process().memory_info().rss))
            return
        await asyncio.gather(*(pub.published.wait() for pub in pubs))
        conn.send((time.perf_counter() - t0, psutil.Process().memory_info().rss))


def worker(conn: Connection, kubeconfig: str, nodes: list[str]) -> None:
    setup_logging("WARNING")  # the publishers' retries, with their errors, as a driver logs them
    raise_fd_limit()
    asyncio.run(serve(conn, kubeconfig, nodes))
