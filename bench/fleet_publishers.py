"""Worker process of :mod:`bench_fleet_api`: many nodes' slice publishers (the drivers' own
:class:`accel_core.dra.publisher.SlicePublisher`, each with its own API client and so its own connections, built as
``neuron-dra-driver serve`` builds it) as asyncio tasks on one event loop, driven by commands on a pipe.

Commands: ``start`` (every publisher publishes the devices of a trn2.48xlarge node and keeps its watch; answers
when all have published), ``health`` (one device per node turns unhealthy; answers when all have republished),
``rollout`` (the publishers stop and new ones start, as the pods of a DaemonSet update: a new
``draDriverVersion``, devices healthy again), ``labels`` (answers when every node's devices carry the
``networkNodeLayer1`` its Node was just labelled with; only with ``label_watch``: each publisher then also has
the driver's :class:`accel_core.dra.nodelabels.NodeLabelWatch` on its Node, on the same client), ``stop``
(publishers stop, slices stay; answers and exits). Each answer, and the first message (ready), is
``(seconds, RSS bytes)``.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import resource
import time
from multiprocessing.connection import Connection

import psutil
from fleet_shapes import scan_devices

from accel_core.dra.cli import kube_client, kube_config
from accel_core.dra.nodelabels import AWS_TOPOLOGY_LABELS, NodeLabelWatch, with_attributes
from accel_core.dra.publisher import SlicePublisher
from accel_core.dra.slicemodel import SliceDevice, Taint, Version
from accel_core.logs import setup_logging


def raise_fd_limit() -> None:
    """Each publisher holds a connection (its watch) and sometimes a second: lift the soft limit to the hard one."""
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


async def serve(conn: Connection, kubeconfig: str, nodes: list[str], label_watch: bool = False) -> None:
    (kind,) = scan_devices("trn2.48xlarge", efa=False)
    sick = [dataclasses.replace(d, taints=(Taint(f"{kind.driver}/unhealthy", "EccUncorrected"),)) if i == 0 else d
            for i, d in enumerate(kind.devices)]
    updated = [dataclasses.replace(d, attributes={**d.attributes, "draDriverVersion": Version("99.0.0")})
               for d in kind.devices]
    config = kube_config(kubeconfig)
    stop = asyncio.Event()
    pubs: list[SlicePublisher] = []
    watches: list[NodeLabelWatch] = []
    current: list[SliceDevice] = list(kind.devices)

    def hand_over(pub: SlicePublisher, watch: NodeLabelWatch | None) -> None:
        pub.set_devices(with_attributes(current, watch.attributes) if watch else current, kind.counters)
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
            current = list(kind.devices if command == "start" else updated)
            watches = []
            for pub in pubs:
                if label_watch:
                    watch = NodeLabelWatch(pub.client, pub.node_name, AWS_TOPOLOGY_LABELS, lambda: None)
                    watch.on_change = functools.partial(hand_over, pub, watch)
                    watches.append(watch)
                hand_over(pub, watches[-1] if label_watch else None)
            tasks = [asyncio.create_task(w.run(stop)) for w in watches]
            tasks += [asyncio.create_task(publish(pub, watches[i] if label_watch else None, stop))
                      for i, pub in enumerate(pubs)]
        elif command == "health":
            current = sick
            for pub, watch in zip(pubs, watches or [None] * len(pubs), strict=True):
                hand_over(pub, watch)
        elif command == "labels":
            while not all(w.attributes.get("networkNodeLayer1") for w in watches):
                await asyncio.sleep(0.05)
        elif command == "stop":
            await stop_all()
            conn.send((time.perf_counter() - t0, psutil.Process().memory_info().rss))
            return
        await asyncio.gather(*(pub.published.wait() for pub in pubs))
        conn.send((time.perf_counter() - t0, psutil.Process().memory_info().rss))


async def publish(pub: SlicePublisher, watch: NodeLabelWatch | None, stop: asyncio.Event) -> None:
    """As the driver publishes: with a Node watch, once it has read the Node, whose UID it hands over (no GET)."""
    if watch is not None:
        await watch.read.wait()
        if watch.node is not None:
            pub.know_node(watch.node)
    await pub.run(stop)


def worker(conn: Connection, kubeconfig: str, nodes: list[str], label_watch: bool = False) -> None:
    setup_logging("WARNING")  # the publishers' retries, with their errors, as a driver logs them
    raise_fd_limit()
    asyncio.run(serve(conn, kubeconfig, nodes, label_watch))
