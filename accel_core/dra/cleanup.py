"""Unprepare checkpoint entries whose claims the API server says are gone, replaced, or no longer allocated here.

An entry can outlive its claim: an earlier version crashed mid-prepare (``PrepareStarted``) and the kubelet never came
back, or the Pod was force-deleted while the driver was down so the kubelet never called unprepare. Such an entry
would reserve its devices forever ("already prepared for another claim").

Each pass reads every entry's claim by namespace/name. An entry is stale when the claim is gone (404), has
another UID, is not allocated, or has no allocation result of this driver in this node's pool (an entry whose
namespace or name is not a valid Kubernetes name, which no API object can have, is stale without asking); stale
entries are
unprepared through the same serialized call the kubelet's NodeUnprepareResources uses (CDI spec removed, entry
dropped, devices freed), so a cleanup never interleaves with a prepare. Any other API error (server away, 5xx,
timeout) ends the pass without touching anything; the next pass retries.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass

from lightkube.resources.resource_v1 import ResourceClaim

from accel_core.dra.claims import ClaimReader
from accel_core.dra.metrics import DriverMetrics
from accel_core.dra.prepared import PreparedClaim
from accel_core.dra.store import ClaimStore
from accel_core.dra.types import ClaimError, ClaimRef, PreparedDevice
from accel_core.k8snames import object_name_problem
from accel_core.logs import kv
from accel_core.watch import STOP, wake

log = logging.getLogger(__name__)

DEFAULT_CLEANUP_INTERVAL = 600.0

#: ``reason`` label values of ``<prefix>_stale_claims_cleaned_total``.
REASON_DELETED = "deleted"
REASON_REPLACED = "replaced"
REASON_NOT_ALLOCATED = "not_allocated"
REASON_ALLOCATED_ELSEWHERE = "allocated_elsewhere"
REASON_INVALID = "invalid"

Unprepare = Callable[[list[ClaimRef]], Awaitable[Mapping[str, tuple[list[PreparedDevice], str]]]]


@dataclass(frozen=True)
class Staleness:
    reason: str
    message: str


@dataclass(frozen=True)
class CleanedClaim:
    ref: ClaimRef
    staleness: Staleness


def staleness(claim: ResourceClaim | None, uid: str, *, driver: str, pool: str) -> Staleness | None:
    """Why the entry for ``uid`` is stale given the claim read from the API server, or None when it is live."""
    if claim is None:
        return Staleness(REASON_DELETED, "the claim no longer exists in the API server")
    api_uid = claim.metadata.uid if claim.metadata else None
    if api_uid != uid:
        return Staleness(REASON_REPLACED, f"the claim was replaced: the API server has UID {api_uid}")
    allocated = claim.status.allocation if claim.status else None
    if allocated is None:
        return Staleness(REASON_NOT_ALLOCATED, "the claim is no longer allocated")
    results = (allocated.devices.results if allocated.devices else None) or []
    if not any(r.driver == driver and r.pool == pool for r in results):
        return Staleness(REASON_ALLOCATED_ELSEWHERE, f"the allocation has no devices of {driver} in pool {pool}")
    return None


class StaleClaimCleaner:
    """Runs cleanup passes; ``unprepare`` must be the plugin's serialized ``DraPlugin.unprepare_claims``."""

    def __init__(self, *, store: ClaimStore, reader: ClaimReader, unprepare: Unprepare, driver: str, pool: str,
                 metrics: DriverMetrics) -> None:
        self.store = store
        self.reader = reader
        self.unprepare = unprepare
        self.driver = driver
        self.pool = pool
        self.metrics = metrics

    async def run(self, stop: asyncio.Event, interval: float) -> None:
        """A pass now, then one every ``interval`` seconds until ``stop`` is set."""
        while not stop.is_set():
            try:
                await self.clean_once()
            except Exception:  # a bug here must not end the loop (or the driver)
                log.exception("stale claim cleanup failed")
            if await wake(stop, timeout=interval) == STOP:
                return

    async def clean_once(self) -> list[CleanedClaim]:
        """One pass over the checkpoint; returns the claims it unprepared."""
        cleaned: list[CleanedClaim] = []
        for entry in self.store.claims():
            invalid = object_name_problem(entry.namespace, entry.name)
            if invalid:
                if await self._unprepare(entry, Staleness(REASON_INVALID, f"invalid claim reference: {invalid}")):
                    cleaned.append(CleanedClaim(ClaimRef(entry.namespace, entry.uid, entry.name),
                                                Staleness(REASON_INVALID, invalid)))
                continue
            try:
                claim = await asyncio.to_thread(self.reader.read, entry.namespace, entry.name)
            except ClaimError as exc:
                log.warning("stale claim cleanup: cannot read claims, retrying at the next interval",
                            extra=kv(claim=entry.describe(), error=exc))
                break
            why = staleness(claim, entry.uid, driver=self.driver, pool=self.pool)
            if why is None:
                continue
            if await self._unprepare(entry, why):
                cleaned.append(CleanedClaim(ClaimRef(entry.namespace, entry.uid, entry.name), why))
        return cleaned

    async def _unprepare(self, entry: PreparedClaim, why: Staleness) -> bool:
        if self.store.get(entry.uid) != entry:
            return False  # the kubelet prepared or unprepared it while the claim was being read
        ref = ClaimRef(entry.namespace, entry.uid, entry.name)
        _, error = (await self.unprepare([ref])).get(entry.uid, ([], "no result"))
        if error:
            log.warning("stale claim cleanup: unprepare failed", extra=kv(claim=entry.describe(), error=error))
            return False
        self.metrics.stale_claims_cleaned.labels(why.reason).inc()
        log.info("unprepared stale claim", extra=kv(claim=entry.describe(), state=entry.state, reason=why.reason,
                                                    why=why.message, devices=list(entry.devices)))
        return True
