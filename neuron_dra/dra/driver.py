"""The Neuron DRA handler: prepare and unprepare claims (the kubelet side), report device health.

Prepare, for each claim the kubelet names:

1. a claim already prepared (``PrepareCompleted`` in the checkpoint) gets the same answer again, and its CDI
   spec is re-created if it went missing; nothing else is read;
2. otherwise the claim is read from the API server and checked (same UID, allocated), and only its results for
   ``neuron.aws.com`` in this node's pool are kept;
3. opaque configs are decoded strictly (class configs first, claim configs win);
4. every device must exist here and must not be held by another claim (the last line of defence against handing
   a device out twice);
5. the checkpoint records ``PrepareStarted``, the CDI spec is written, the checkpoint records ``PrepareCompleted``.

Unprepare removes the CDI spec and the checkpoint entry; an unknown claim (already unprepared, or never prepared
here) is not an error, and the API server is never consulted, so deleted claims unprepare fine.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping

from accel_core.dra.cdi import CdiError, CdiSpecWriter
from accel_core.dra.types import ClaimError, ClaimRef, DeviceHealthReport, PreparedDevice
from accel_core.logs import kv
from neuron_dra.discovery import NeuronInventory
from neuron_dra.dra.attributes import DRIVER_NAME, device_name
from neuron_dra.dra.claims import ApiClaimReader, ClaimReader, allocated_for_node
from neuron_dra.dra.config import ConfigError, configs_for_requests
from neuron_dra.dra.health import DeviceCondition, health_reports
from neuron_dra.dra.metrics import DriverMetrics
from neuron_dra.dra.prepared import STATE_COMPLETED, PreparedClaim, plan_claim
from neuron_dra.dra.store import ClaimStore

log = logging.getLogger(__name__)

CDI_VENDOR = "k8s.neuron.aws.com"
CDI_CLASS = "claim"
HEALTH_TIMEOUT_SECONDS = 60


class NeuronDriver:
    """Implements :class:`accel_core.dra.types.DraHandler` for ``neuron.aws.com``."""

    driver_name = DRIVER_NAME

    def __init__(
        self,
        *,
        node_name: str,
        reader: ClaimReader,
        cdi: CdiSpecWriter,
        store: ClaimStore,
        inventory: Callable[[], NeuronInventory],
        blocked: Callable[[], str | None] = lambda: None,
        metrics: DriverMetrics | None = None,
    ) -> None:
        self.node_name = node_name
        self.reader = reader
        self.cdi = cdi
        self.store = store
        self._inventory = inventory
        self._blocked = blocked
        self.metrics = metrics or DriverMetrics(None)
        self._conditions: dict[int, DeviceCondition] = {}
        #: Seconds the last prepare spent reading the claim, and everything else (for benchmarks).
        self.last_read_seconds = 0.0
        self.last_local_seconds = 0.0

    # -- restore ---------------------------------------------------------------------------------------------------
    def restore(self) -> list[str]:
        """Re-create missing CDI specs of completed claims (after a restart or a reboot); returns their UIDs."""
        restored = []
        for claim in self.store.claims():
            if claim.state != STATE_COMPLETED or self.cdi.exists(claim.uid):
                continue
            try:
                self.cdi.write(claim.uid, claim.cdi_devices())
            except CdiError as exc:
                log.error("cannot re-create CDI spec", extra=kv(claim=claim.describe(), error=exc))
                continue
            restored.append(claim.uid)
            self.metrics.cdi_specs_restored.inc()
            log.info("re-created CDI spec from the checkpoint", extra=kv(claim=claim.describe()))
        self._update_gauges()
        return restored

    # -- prepare ---------------------------------------------------------------------------------------------------
    async def prepare(self, claim: ClaimRef) -> list[PreparedDevice]:
        try:
            return await self._prepare(claim)
        except ClaimError:
            self.metrics.claim_errors.labels("prepare").inc()
            raise

    async def _prepare(self, claim: ClaimRef) -> list[PreparedDevice]:
        if self.store.error:
            raise ClaimError(f"checkpoint {self.store.path} is unusable ({self.store.error}); refusing to prepare so "
                             "no device is handed out twice")
        existing = self.store.get(claim.uid)
        if existing is not None and existing.state == STATE_COMPLETED:
            self._ensure_spec(existing)
            return existing.prepared_devices(self.cdi.qualified)
        reason = self._blocked()
        if reason:
            raise ClaimError(reason)

        start = time.perf_counter()
        data = await self.reader.read(claim.namespace, claim.name)
        read_seconds = time.perf_counter() - start
        self.last_read_seconds = read_seconds
        self.metrics.claim_read_seconds.observe(read_seconds)

        local_start = time.perf_counter()
        alloc = allocated_for_node(data, claim, driver=DRIVER_NAME, pool=self.node_name)
        try:
            configs = configs_for_requests(alloc.configs, alloc.requests)
        except ConfigError as exc:
            raise ClaimError(str(exc)) from exc
        plan = plan_claim(alloc, self._inventory(), configs)
        for index in plan.indices:
            holder = self.store.holder(index, other_than=claim.uid)
            if holder is not None:
                raise ClaimError(f"device {device_name(index)} is already prepared for claim {holder.describe()}")
        try:
            self.store.put(plan)
            self.cdi.write(plan.uid, plan.cdi_devices())
            done = plan.with_state(STATE_COMPLETED)
            self.store.put(done)
        except (OSError, CdiError) as exc:
            raise ClaimError(f"cannot record the prepared claim: {exc}") from exc
        self._update_gauges()
        self.last_local_seconds = time.perf_counter() - local_start
        self.metrics.prepare_local_seconds.observe(self.last_local_seconds)
        return done.prepared_devices(self.cdi.qualified)

    def _ensure_spec(self, claim: PreparedClaim) -> None:
        if self.cdi.exists(claim.uid):
            return
        try:
            self.cdi.write(claim.uid, claim.cdi_devices())
        except CdiError as exc:
            raise ClaimError(f"cannot re-create the CDI spec: {exc}") from exc
        self.metrics.cdi_specs_restored.inc()
        log.info("re-created missing CDI spec", extra=kv(claim=claim.describe()))

    # -- unprepare -------------------------------------------------------------------------------------------------
    async def unprepare(self, claim: ClaimRef) -> None:
        self.cdi.remove(claim.uid)
        if self.store.error:
            log.warning("checkpoint unusable; removed the CDI spec only", extra=kv(claim=str(claim)))
            return
        try:
            removed = self.store.remove(claim.uid)
        except OSError as exc:
            self.metrics.claim_errors.labels("unprepare").inc()
            raise ClaimError(f"cannot update checkpoint {self.store.path}: {exc}") from exc
        if removed is None:
            log.debug("unprepare of an unknown claim: nothing to do", extra=kv(claim=str(claim)))
        self._update_gauges()

    # -- health ----------------------------------------------------------------------------------------------------
    def set_conditions(self, conditions: Mapping[int, DeviceCondition]) -> bool:
        """Record device health; True when it changed."""
        new = dict(conditions)
        changed = new != self._conditions
        self._conditions = new
        self.metrics.devices.set(len(new))
        for index, cond in new.items():
            self.metrics.device_healthy.labels(device_name(index)).set(1 if cond.healthy else 0)
        return changed

    def health(self) -> list[DeviceHealthReport] | None:
        return health_reports(self.node_name, self._conditions, device_name, HEALTH_TIMEOUT_SECONDS)

    def _update_gauges(self) -> None:
        claims = self.store.claims()
        self.metrics.prepared_claims.set(len(claims))
        self.metrics.prepared_devices.set(sum(len(c.indices) for c in claims))


__all__ = ["ApiClaimReader", "CDI_CLASS", "CDI_VENDOR", "NeuronDriver"]
