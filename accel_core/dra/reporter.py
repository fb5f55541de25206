"""Writes claim problems where users look (bodies: :mod:`accel_core.dra.claimreport`), from a task on the event loop.

- A failed prepare (:meth:`ClaimReporter.submit`, from the prepare's thread; returns at once): the claim's
  ``status.devices`` get ``Ready=False`` (server-side apply, field manager = the driver, as the prepared status),
  and each pod in ``reservedFor`` gets a Warning Event. The kubelet retries a failed prepare every few seconds:
  the same claim with the same reason and message is written once, and its Event is created once and then updated
  (``series.count``) at most every ``series_seconds``. A claim prepared meanwhile is skipped.
- Health (:meth:`ClaimReporter.health_changed`, on the loop): each prepared claim that holds a device whose health
  flipped gets its ``Ready`` conditions re-applied (False ``DeviceUnhealthy`` / True ``Prepared``) with the field
  manager ``<driver>-health``, which owns only the conditions, so the ``data`` written at prepare stays.

Nothing here adds a request to a successful prepare. Failed writes are logged; a claim that is gone is dropped.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from lightkube import ApiError, AsyncClient
from lightkube.resources.events_v1 import Event
from lightkube.resources.resource_v1 import ResourceClaim
from lightkube.types import PatchType

from accel_core.dra.claimreport import (
    ClaimProblem,
    PodRef,
    event_body,
    event_name,
    health_changes,
    health_status_patch,
    problem_status_patch,
)
from accel_core.dra.prepared import PreparedClaim
from accel_core.health import DeviceHealth
from accel_core.logs import kv
from accel_core.tasks import queued_until

log = logging.getLogger(__name__)

#: Seconds between updates of a repeating Event's series (the first occurrence is written at once).
SERIES_SECONDS = 60.0
#: Problems and health writes waiting, at most; claims and Events remembered for de-duplication, at most.
MAX_PENDING = 1024
MAX_REMEMBERED = 4096
#: Differs per process: a restarted driver reports a still-failing claim once more (an Event's eventTime is
#: immutable, so it cannot continue the old process's Event without reading it first).
_PROCESS = os.urandom(4).hex()


@dataclass
class _Sent:
    name: str
    first: datetime
    count: int
    written_count: int
    written_at: float


class ClaimReporter:
    """Claim conditions and pod Events for one driver on one node; :meth:`run` does the writing."""

    def __init__(self, client: AsyncClient, driver: str, node: str, *, prepared: Callable[[str], PreparedClaim | None],
                 health: Callable[[str], DeviceHealth | None], write_status: bool = True,
                 series_seconds: float = SERIES_SECONDS) -> None:
        self.client = client
        self.driver = driver
        self.node = node
        self.prepared = prepared
        self.health = health
        self.write_status = write_status
        self.series_seconds = series_seconds
        self.health_manager = f"{driver}-health"
        self._loop: asyncio.AbstractEventLoop | None = None
        self._queue: asyncio.Queue[ClaimProblem | str] = asyncio.Queue()
        self._health_queued: set[str] = set()
        self._seen_health: dict[str, bool] = {}
        self._status: OrderedDict[str, tuple[str, str]] = OrderedDict()  # claim UID -> (reason, cause) written
        self._events: OrderedDict[tuple[str, str, str, str], _Sent] = OrderedDict()
        self.status_writes = 0
        self.events_created = 0
        self.events_updated = 0
        self.failed = 0

    # -- input -----------------------------------------------------------------------------------------------------
    def submit(self, problems: Sequence[ClaimProblem]) -> None:
        """Queue failed prepares (any thread; returns at once). Before :meth:`run` started, nothing is kept."""
        loop = self._loop
        if loop is None or not problems or loop.is_closed():
            return
        with contextlib.suppress(RuntimeError):  # the loop closed meanwhile (shutting down)
            loop.call_soon_threadsafe(self._put_problems, list(problems))

    def resolved(self, uids: Sequence[str]) -> None:
        """The claims were prepared (any thread): a later failure is reported afresh."""
        loop = self._loop
        if loop is None or not uids or loop.is_closed():
            return
        with contextlib.suppress(RuntimeError):
            loop.call_soon_threadsafe(self._forget, list(uids))

    def health_changed(self, health: Mapping[str, DeviceHealth], claims: Sequence[PreparedClaim]) -> int:
        """On the loop: queue a conditions write for each prepared claim holding a device whose health flipped
        since the last call (the first call compares with all healthy, as the prepare wrote); returns how many."""
        changed = health_changes(self._seen_health, health)
        self._seen_health = {d: h.healthy for d, h in health.items()}
        queued = 0
        if not changed or not self.write_status:
            return 0
        for claim in claims:
            if changed.intersection(claim.devices) and claim.uid not in self._health_queued:
                if self._queue.qsize() >= MAX_PENDING:
                    log.warning("too many claim condition writes pending; dropping one", extra=kv(
                        claim=claim.describe()))
                    continue
                self._health_queued.add(claim.uid)
                self._queue.put_nowait(claim.uid)
                queued += 1
        return queued

    def _put_problems(self, problems: list[ClaimProblem]) -> None:
        for problem in problems:
            if self._queue.qsize() >= MAX_PENDING:
                log.warning("too many claim problems pending; dropping one", extra=kv(claim=problem.describe()))
                continue
            self._queue.put_nowait(problem)

    def _forget(self, uids: list[str]) -> None:
        for uid in uids:
            self._status.pop(uid, None)
        gone = set(uids)
        for key in [k for k in self._events if k[0] in gone]:
            del self._events[key]

    # -- writing ---------------------------------------------------------------------------------------------------
    async def run(self, stop: asyncio.Event) -> None:
        """Write until ``stop``."""
        self._loop = asyncio.get_running_loop()
        try:
            async for job in queued_until(self._queue, stop):
                if isinstance(job, str):
                    self._health_queued.discard(job)
                    await self._write_health(job)
                else:
                    await self._report(job)
        finally:
            self._loop = None

    async def _report(self, problem: ClaimProblem) -> None:
        if self.prepared(problem.uid) is not None:
            return  # a retry prepared it meanwhile: its prepared status says so
        now = datetime.now(UTC)
        written = self._status.get(problem.uid) == (problem.reason, problem.cause)
        if self.write_status and not written and await self._apply(
                problem_status_patch(problem, self.driver, self.node, now), problem.namespace, problem.name,
                self.driver, problem.describe()):
            self._remember(self._status, problem.uid, (problem.reason, problem.cause))
            self.status_writes += 1
        for pod in problem.pods:
            await self._event(problem, pod, now)

    async def _event(self, problem: ClaimProblem, pod: PodRef, now: datetime) -> None:
        key = (problem.uid, pod.uid, problem.reason, problem.cause)
        loop_now = asyncio.get_running_loop().time()
        sent = self._events.get(key)
        if sent is None:
            sent = _Sent(event_name(pod.name, "\0".join((_PROCESS, *key))), now, 1, 0, loop_now)
        else:
            sent.count += 1
            if loop_now - sent.written_at < self.series_seconds:
                return
        body = event_body(problem, pod, name=sent.name, driver=self.driver, node=self.node, first=sent.first,
                          count=sent.count, last=now)
        if await self._apply_event(body, problem):
            if sent.written_count == 0:
                self.events_created += 1
            else:
                self.events_updated += 1
            sent.written_count, sent.written_at = sent.count, loop_now
            self._remember(self._events, key, sent)
        elif sent.written_count == 0:
            self._events.pop(key, None)  # never written: the next retry tries again

    async def _write_health(self, uid: str) -> None:
        claim = self.prepared(uid)
        if claim is None:
            return
        body = health_status_patch(claim, self.driver, self.node, self.health, datetime.now(UTC))
        if await self._apply(body, claim.namespace, claim.name, self.health_manager, claim.describe()):
            self.status_writes += 1
            states = {c["conditions"][0]["status"] for c in body["status"]["devices"]}
            log.info("claim conditions updated after a health change", extra=kv(
                claim=claim.describe(), ready=",".join(sorted(states))))

    async def _apply(self, body: dict[str, Any], namespace: str, name: str, manager: str, what: str) -> bool:
        try:
            await self.client.patch(ResourceClaim.Status, name, body, namespace=namespace,
                                    patch_type=PatchType.APPLY, field_manager=manager, force=True)
        except ApiError as exc:
            if exc.status.code in (404, 409):
                log.info("claim gone before its conditions were written", extra=kv(claim=what,
                                                                                   status=exc.status.code))
                return False
            self._failed("could not write the claim's conditions", what, exc)
            return False
        except Exception as exc:  # transport errors
            self._failed("could not write the claim's conditions", what, exc)
            return False
        return True

    async def _apply_event(self, body: dict[str, Any], problem: ClaimProblem) -> bool:
        try:
            await self.client.patch(Event, body["metadata"]["name"], body, namespace=problem.namespace,
                                    patch_type=PatchType.APPLY, field_manager=self.driver, force=True)
        except Exception as exc:
            self._failed("could not raise the Event on the claim's pod", problem.describe(), exc)
            return False
        return True

    def _failed(self, what: str, claim: str, exc: Exception) -> None:
        self.failed += 1
        log.warning(what, extra=kv(claim=claim, error=exc))

    @staticmethod
    def _remember(table: OrderedDict[Any, Any], key: Any, value: Any) -> None:
        table[key] = value
        table.move_to_end(key)
        while len(table) > MAX_REMEMBERED:
            table.popitem(last=False)
