"""Poll the kubelet's PodResources v1 ``List`` (through the core :class:`~accel_core.podresources.PodResourcesClient`)
for the Neuron IDs every container holds.

The socket is ``<kubelet-root>/pod-resources/kubelet.sock``. Each successful List replaces the listed in-use sets
of the :class:`~neuron_dra.deviceplugin.inuse.UsageTracker`; a failed one keeps what is known (see usage.py).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from pathlib import Path

from prometheus_client import CollectorRegistry, Counter

from accel_core.kubeletapi import podresources_v1_pb2 as pr
from accel_core.logs import kv
from accel_core.podresources import PodResourcesClient, PodResourcesUnavailable, devices_by_pod, devices_in_use
from accel_core.watch import EVENT, STOP, wake
from neuron_dra.deviceplugin.inuse import RESOURCES, UsageTracker

log = logging.getLogger(__name__)

LIST_TIMEOUT_S = 5.0


def in_use_from(response: pr.ListPodResourcesResponse) -> dict[str, set[str]]:
    """Neuron resource -> IDs held by any container."""
    return devices_in_use(response, RESOURCES)


class PodResourcesPoller:
    """Calls List and feeds the tracker: every ``interval`` seconds while anything is in use or waiting for the List
    to confirm it (that is when devices can be freed), every ``idle_interval`` seconds while nothing is (a List
    then can only confirm that nothing is held, and each costs a few milliseconds of gRPC CPU on an idle node).

    :meth:`kick` (called after every Allocate) ends an idle wait: the next List follows ``interval`` seconds later.
    """

    def __init__(
        self,
        socket: Path,
        usage: UsageTracker,
        on_change: Callable[[], None],
        *,
        interval: float = 2.0,
        idle_interval: float = 30.0,
        registry: CollectorRegistry | None = None,
    ) -> None:
        self._socket = socket
        self._client = PodResourcesClient(socket, LIST_TIMEOUT_S)
        self._usage = usage
        self._on_change = on_change
        self._interval = interval
        self._idle_interval = max(interval, idle_interval)
        self._kick = asyncio.Event()
        self._idle_wait = False
        self._last_error = ""
        reg = registry if registry is not None else CollectorRegistry()
        self._calls = Counter("neuron_device_plugin_pod_resources_list_total",
                              "PodResources List calls by result", ["result"], registry=reg)

    def kick(self) -> None:
        """An Allocate happened: end an idle wait (a no-op on the fast pace, so Allocates wake nothing)."""
        if self._idle_wait:
            self._kick.set()

    async def poll_once(self) -> bool:
        """One List; returns True when it succeeded."""
        try:
            resp = await self._client.list_async()
        except PodResourcesUnavailable as exc:
            self._fail(str(exc))
            return False
        self._calls.labels("ok").inc()
        if self._last_error:
            log.info("PodResources List works again", extra=kv(socket=str(self._socket)))
            self._last_error = ""
        if self._usage.apply_list(in_use_from(resp), devices_by_pod(resp, RESOURCES)):
            self._on_change()
        return True

    def next_interval(self) -> float:
        """Seconds until the next List: short while devices are held or pending, long on an idle node."""
        usage = self._usage
        busy = usage.pending_count() > 0 or any(usage.in_use(r) for r in RESOURCES) or not usage.list_ok
        return self._interval if busy else self._idle_interval

    async def run(self, stop: asyncio.Event) -> None:
        try:
            while True:
                try:
                    await self.poll_once()
                except Exception:  # never let a bad response end the poller
                    log.exception("PodResources poll failed")
                interval = self.next_interval()
                self._idle_wait = interval > self._interval
                woke = await wake(stop, self._kick, timeout=interval)
                self._idle_wait = False
                if woke == STOP:
                    return
                if woke == EVENT:  # an Allocate: the kubelet lists it once the container exists, so follow it
                    self._kick.clear()
                    if await wake(stop, timeout=self._interval) == STOP:
                        return
        finally:
            await self._client.aclose()

    def _fail(self, message: str) -> None:
        self._calls.labels("error").inc()
        self._usage.list_failed()
        if message != self._last_error:
            log.warning(message + "; keeping allocations recorded from Allocate until it answers",
                        extra=kv(socket=str(self._socket)))
            self._last_error = message
