"""Device status: the ResourceClaim's ``status.devices`` entries for the devices this driver prepared
(DRAResourceClaimDeviceStatus, GA in Kubernetes 1.37), so ``kubectl get resourceclaim -o yaml`` shows which device
went where.

Off the prepare's critical path: the prepare's thread only hands the prepared claims over
(:meth:`DeviceStatusWriter.submit`, a ``call_soon_threadsafe``), and a task on the event loop writes them
``DELAY_SECONDS`` later, long after the kubelet has its answer (a claim unprepared meanwhile is skipped). Each claim
is one server-side apply of ``resourceclaims/status`` with the driver's field manager, carrying only this driver's
entries (the list is a map keyed by driver, pool, device and share ID, so another driver's entries are left alone)
and the claim's UID (a claim replaced meanwhile is refused by the API server, not overwritten). Each entry gets a
``Ready`` condition (False, ``DeviceUnhealthy``, for a device unhealthy at the write; later health changes and
failed prepares are written by :mod:`accel_core.dra.reporter`), the profile's ``data`` and, where the device has a
network interface, ``networkData``. A failed write is logged and retried a few times; a claim that is gone is
dropped. The status is not written again for a claim answered from the checkpoint (it was written the first time).

The API server authorizes such a write twice (granular status authorization, on by default since 1.36):
``patch`` on ``resourceclaims/status``, and for ``status.devices`` the driver's own permission on the
``resourceclaims/driver`` subresource, named by the driver (see the charts' ClusterRoles).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from typing import Any

from lightkube import ApiError, AsyncClient
from lightkube.resources.resource_v1 import ResourceClaim
from lightkube.types import PatchType

from accel_core.dra.claimreport import API_VERSION, ready_condition
from accel_core.dra.logtext import Throttle, cut
from accel_core.dra.prepared import PreparedClaim
from accel_core.health import DeviceHealth
from accel_core.logs import kv
from accel_core.tasks import queued_until
from accel_core.watch import STOP, wake

log = logging.getLogger(__name__)

#: Attempts per claim, and the pause before the first retry (doubled each time).
ATTEMPTS = 4
RETRY_SECONDS = 1.0
#: Claims waiting to be written, at most; more are dropped with a warning (the API server is not keeping up), logged
#: at most once per DROP_LOG_SECONDS with the count of drops since the last line.
MAX_PENDING = 4096
#: Seconds between a prepare and its status write: the kubelet's next calls (and the container start) go first,
#: and a claim unprepared meanwhile is not written at all (its status would describe devices it no longer has).
DELAY_SECONDS = 0.2
DROP_LOG_SECONDS = 10.0


def status_patch(claim: PreparedClaim, driver: str, now: datetime,
                 health: Callable[[str], DeviceHealth | None] = lambda device: None, node: str = "this node"
                 ) -> dict[str, Any]:
    """The server-side apply body for ``claim``: this driver's ``status.devices`` entries, one per device; a device
    unhealthy now gets ``Ready=False`` (``DeviceUnhealthy``)."""
    entries = []
    for device, status in claim.status:
        entry: dict[str, Any] = {
            "driver": driver, "pool": claim.pool, "device": device,
            "conditions": [ready_condition(f"{claim.namespace}/{claim.name}", device, node, health(device), now)],
            "data": dict(status.data),
        }
        if status.network:
            entry["networkData"] = dict(status.network)
        entries.append(entry)
    return {"apiVersion": API_VERSION, "kind": "ResourceClaim",
            "metadata": {"name": claim.name, "namespace": claim.namespace, "uid": claim.uid},
            "status": {"devices": entries}}


class DeviceStatusWriter:
    """Writes the device status of prepared claims from a task on the event loop (:meth:`run`)."""

    def __init__(self, client: AsyncClient, driver: str, *,
                 still_prepared: Callable[[str], object] = lambda uid: True, delay: float = DELAY_SECONDS,
                 health: Callable[[str], DeviceHealth | None] = lambda device: None, node: str = "this node") -> None:
        self.client = client
        self.driver = driver
        self.health = health
        self.node = node
        self.still_prepared = still_prepared
        self.delay = delay
        self._loop: asyncio.AbstractEventLoop | None = None
        self._queue: asyncio.Queue[tuple[float, PreparedClaim]] = asyncio.Queue()
        self._queued: set[str] = set()  # claim UIDs in the queue: a claim prepared again meanwhile is written once
        self._drops = Throttle(log, DROP_LOG_SECONDS)
        self.dropped = 0
        self.written = 0
        self.failed = 0
        self.skipped = 0

    def submit(self, claims: Sequence[PreparedClaim]) -> None:
        """Queue the claims' status (any thread; returns at once). Before :meth:`run` started, nothing is kept."""
        loop = self._loop
        todo = [c for c in claims if c.status]
        if loop is None or not todo or loop.is_closed():
            return
        with contextlib.suppress(RuntimeError):  # the loop closed meanwhile (shutting down)
            loop.call_soon_threadsafe(self._put, todo)

    def _put(self, claims: Sequence[PreparedClaim]) -> None:
        due = asyncio.get_running_loop().time() + self.delay
        for claim in claims:
            if claim.uid in self._queued:
                continue
            if self._queue.qsize() >= MAX_PENDING:
                self.dropped += 1
                self._drops.warning("too many device status writes pending; dropping them", extra=kv(
                    claim=claim.describe(), pending=MAX_PENDING, dropped=self.dropped))
                continue
            self._queue.put_nowait((due, claim))
            self._queued.add(claim.uid)

    async def run(self, stop: asyncio.Event) -> None:
        """Write queued claims until ``stop``."""
        self._loop = asyncio.get_running_loop()
        try:
            async for due, claim in queued_until(self._queue, stop):
                wait = due - self._loop.time()
                if wait > 0 and await wake(stop, timeout=wait) == STOP:
                    return
                self._queued.discard(claim.uid)
                if not self.still_prepared(claim.uid):
                    self.skipped += 1  # unprepared meanwhile: nothing to describe
                    continue
                await self._write(claim, stop)
        finally:
            self._loop = None

    async def _write(self, claim: PreparedClaim, stop: asyncio.Event) -> None:
        pause = RETRY_SECONDS
        for attempt in range(1, ATTEMPTS + 1):
            try:
                body = status_patch(claim, self.driver, datetime.now(UTC), self.health, self.node)
                await self.client.patch(ResourceClaim.Status, claim.name, body, namespace=claim.namespace,
                                        patch_type=PatchType.APPLY, field_manager=self.driver, force=True)
            except ApiError as exc:
                code = exc.status.code
                if code in (404, 409):  # deleted, or replaced by a claim with another UID
                    log.info("claim gone before its device status was written", extra=kv(
                        claim=claim.describe(), status=code))
                    return
                error: Exception = exc
            except Exception as exc:  # transport errors
                error = exc
            else:
                self.written += 1
                return
            if attempt == ATTEMPTS or stop.is_set():
                self.failed += 1
                self._drops.warning("could not write the claim's device status", extra=kv(
                    claim=claim.describe(), attempts=attempt, error=cut(error), failed=self.failed))
                return
            await asyncio.sleep(pause)
            pause *= 2
