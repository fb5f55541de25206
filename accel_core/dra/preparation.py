"""The DRA handler for any driver profile: prepare and unprepare claims (the kubelet side), report device health.

Prepare, for each claim the kubelet names (after checking its namespace, name and UID: a bad one fails that claim
before anything is read or recorded):

1. a claim already prepared (``PrepareCompleted`` in the checkpoint) gets the same answer again, and its CDI
   spec is re-created if it went missing; nothing else is read;
2. otherwise the claim is read from the API server and checked (same UID, allocated), and only its results for
   this driver in this node's pool are kept;
3. opaque configs are decoded strictly (class configs first, claim configs win);
4. the profile turns each request's devices and config into container edits (and refuses unknown devices);
5. no device may be held by another claim (the last line of defence against handing a device out twice), checked
   against the checkpoint as it is on disk (another process, the other pod of a rolling update, may have recorded
   or removed claims: :meth:`ClaimStore.refresh`); a request allocated with admin access (``adminAccess``, a
   monitoring claim) holds none of its devices, so it neither blocks nor is blocked by this check;
6. the CDI names are checked, the CDI spec is written (not synced), and then the checkpoint records the claim
   ``PrepareCompleted`` with one durable journal record; only then does the kubelet get an answer.

The checkpoint is the one durable record; CDI specs are derived from it. A kill at any point leaves a state the
next start repairs (:meth:`DraDriver.restore`, :meth:`DraDriver.remove_orphan_specs`): killed before its
journal record was written, the claim was never answered and its spec is an orphan that start removes (the
kubelet retries the prepare); killed after it, the entry holds the devices and start re-creates a spec that is
missing or damaged (say by a power loss before the page cache reached the disk). ``PrepareStarted`` entries,
written by earlier versions before their CDI spec, still reserve their devices until the kubelet retries or the
cleanup drops them.

Unprepare removes the CDI spec and the checkpoint entry; an unknown claim (already unprepared, or never prepared
here) is not an error, and the API server is never consulted, so deleted claims unprepare fine. Whatever the
kubelet sends, an existing entry is removed once its spec is gone. A spec that cannot be removed (a read-only or
failing CDI directory) fails that claim and keeps its entry, so its devices stay held while a runtime could still
use the spec, and the kubelet retries. A UID that is not a Kubernetes UID (:func:`accel_core.k8snames.is_uid`) names
no spec of ours: its unprepare succeeds, checked before any path is built (only an entry an older driver
recorded under it unchecked is dropped), and a prepare fails that claim.

Disk full (or any write error) leaves the checkpoint and the CDI directory consistent in every order of failure:

- unprepare removes the spec first (a spec that stays keeps its entry: devices held while a runtime could use
  it), then the entry; when that checkpoint write fails, the removed specs are written back from the entries that
  stayed (:meth:`DraDriver._respec`), so the claim is prepared as before and the kubelet retries; if that write
  fails too, the entry without a spec still holds its devices, and no answer names the missing spec (below);
- prepare writes the spec, then the entry; when the checkpoint write fails, the spec goes again (a spec that
  cannot be removed is an orphan no answer names, which start removes);
- a prepare of a recorded claim re-creates a missing spec before it answers, and fails the claim if it cannot.

A request with several claims (:meth:`DraDriver.prepare_blocking`, :meth:`DraDriver.unprepare_blocking`) does the same
steps claim by claim, but reads the claims from the API server at once and records them together: their CDI
specs, then one journal record for all. Devices are checked against the claims planned earlier in the same
request, too. Each phase's time is observed in ``<prefix>_prepare_phase_duration_seconds``.

A request is worked on in one thread from start to end (:meth:`DraDriver.prepare_blocking`, called in the DRA
server's thread): nothing that touches files (the device-plugin guard, the checkpoint and CDI writes) runs on the
event loop. The driver reads nothing from the network: it names the claims it needs
(:meth:`DraDriver.claims_to_read`), and the plugin reads them (:class:`accel_core.dra.claims.ClaimReader`, in the
same thread, before its locks, so a slow API server delays only the prepares that need it) and hands the objects to
:meth:`DraDriver.prepare_blocking` under the locks, which serialize calls: one request at a time works on the
checkpoint and the device plan.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

from lightkube.resources.resource_v1 import ResourceClaim

from accel_core.atomic import clean_stale_temp_files
from accel_core.dra.cdi import CdiError, CdiSpecWriter
from accel_core.dra.claimreport import (
    DEVICE_IN_USE,
    DEVICE_NOT_USABLE,
    DEVICE_PLUGIN_ACTIVE,
    DEVICE_UNHEALTHY,
    INVALID_CONFIG,
    ClaimProblem,
    ClaimProblemError,
    problem_of,
    reason_of,
)
from accel_core.dra.claims import AllocatedDevice, allocated_for_node, check_claim_ref
from accel_core.dra.config import ConfigError, configs_for_requests
from accel_core.dra.logtext import cut
from accel_core.dra.metadata import ClaimIdentity, MetadataDevice, MetadataFiles, encoded_attributes
from accel_core.dra.metrics import DriverMetrics
from accel_core.dra.prepared import STATE_COMPLETED, PreparedClaim, PreparedRequest
from accel_core.dra.profile import DraProfile, RequestEdits
from accel_core.dra.slicemodel import AttributeValue, SliceDevice
from accel_core.dra.store import ClaimStore
from accel_core.dra.types import (
    ClaimError,
    ClaimReads,
    ClaimRef,
    DeviceHealthReport,
    DeviceStatusData,
    PreparedDevice,
)
from accel_core.edits import Mount
from accel_core.health import DeviceHealth
from accel_core.k8snames import UID_RULE, is_uid
from accel_core.logs import kv

log = logging.getLogger(__name__)

CDI_CLASS = "claim"
HEALTH_TIMEOUT_SECONDS = 60


def _not_read() -> ClaimError:
    """A claim the plugin did not read (it reads each one :meth:`DraDriver.claims_to_read` names under the locks)."""
    return ClaimError("the claim was not read from the API server; the kubelet retries")


def cdi_vendor(driver: str) -> str:
    """The CDI vendor of a driver's claim specs: ``k8s.<driver>`` (kind ``k8s.<driver>/claim``)."""
    return f"k8s.{driver}"


class PrepareNotices(Protocol):
    """Told what prepares did, from the prepare's thread (each call must return at once)."""

    def prepared(self, claims: Sequence[PreparedClaim]) -> None:
        """The claims newly prepared, once recorded (device status, problems resolved)."""

    def failed(self, problems: Sequence[ClaimProblem]) -> None:
        """The claims read whose prepare failed (claim conditions and pod Events, :mod:`accel_core.dra.reporter`)."""


class HealthBook:
    """Each published device's health as last recorded, read from any thread (a change swaps the whole map)."""

    def __init__(self) -> None:
        self._health: dict[str, DeviceHealth] = {}

    def get(self, device: str) -> DeviceHealth | None:
        """The device's health (None: not a published device)."""
        return self._health.get(device)

    def set(self, health: Mapping[str, DeviceHealth]) -> bool:
        """Record the health of every published device (in pool order); True when it changed."""
        new = dict(health)
        changed = new != self._health
        self._health = new
        return changed

    def items(self) -> list[tuple[str, DeviceHealth]]:
        return list(self._health.items())


class DraDriver:
    """Implements :class:`accel_core.dra.types.DraHandler` for one :class:`~accel_core.dra.profile.DraProfile`.
    ``inventory`` is the scanned host the profile plans against (:meth:`set_inventory` after each scan);
    ``blocked`` says why no claim may be prepared now (None: they may)."""

    def __init__(
        self,
        profile: DraProfile[Any, Any],
        *,
        node_name: str,
        cdi: CdiSpecWriter,
        store: ClaimStore,
        inventory: Any = None,
        blocked: Callable[[], str | None] | None = None,
        metrics: DriverMetrics | None = None,
        health: HealthBook | None = None,
        notices: PrepareNotices | None = None,
        metadata: MetadataFiles | None = None,
    ) -> None:
        self.profile = profile
        self.driver_name = profile.driver_name
        self.node_name = node_name
        self.cdi = cdi
        self.store = store
        self.inventory = inventory
        self._blocked = blocked
        self.notices = notices
        self.metrics = metrics or DriverMetrics(None, profile.metrics_prefix)
        self._health = health if health is not None else HealthBook()
        #: Device metadata files (KEP-5304) for each prepared request, when on; the published attributes by device.
        self.metadata = metadata
        self._published: Mapping[str, Mapping[str, Any]] = {}  # in the metadata file's form
        self._published_from: Mapping[str, Mapping[str, AttributeValue]] = {}  # ... encoded from these
        #: Seconds the last prepare spent on everything but the claim reads (for benchmarks).
        self.last_local_seconds = 0.0

    def set_inventory(self, inventory: Any) -> None:
        """The host as last scanned (one reference swap: a prepare in flight keeps the one it took)."""
        self.inventory = inventory

    def set_published(self, devices: Sequence[SliceDevice]) -> None:
        """The devices as last handed to the slice publisher: their attributes go into the metadata files (encoded
        again only for a device whose attributes changed: a taint or a rescan hands over the same ones)."""
        if self.metadata is None:
            return
        before = self._published_from
        self._published_from = {d.name: d.attributes for d in devices}
        self._published = {name: self._published[name] if before.get(name) == attrs else encoded_attributes(attrs)
                           for name, attrs in self._published_from.items()}

    # -- restore ---------------------------------------------------------------------------------------------------
    def restore(self) -> list[str]:
        """Re-create missing or damaged CDI specs of completed claims (after a restart, a reboot or a power loss);
        returns their UIDs."""
        restored = []
        for claim in self.store.claims():
            if claim.state != STATE_COMPLETED:
                continue
            try:
                devices = claim.cdi_devices()
                if self.cdi.matches(claim.uid, devices):
                    continue
                self.cdi.write(claim.uid, devices)
            except CdiError as exc:
                log.error("cannot re-create CDI spec", extra=kv(claim=claim.describe(), error=exc))
                continue
            restored.append(claim.uid)
            self.metrics.cdi_specs_restored.inc()
            log.info("re-created CDI spec from the checkpoint", extra=kv(claim=claim.describe()))
        self._update_gauges()
        return restored

    def remove_orphan_specs(self) -> list[str]:
        """Remove this driver's CDI specs that no checkpoint entry refers to (a prepare killed between its spec and
        its checkpoint write was never answered) and temp files a killed spec write left; returns the spec IDs.
        No spec is removed while the checkpoint is unusable, since then it cannot tell which specs are orphans."""
        clean_stale_temp_files(self.cdi.root)
        if self.store.error:
            return []
        removed = []
        for spec_id in self.cdi.spec_ids():
            if self.store.get(spec_id) is not None:
                continue
            try:
                if self.cdi.remove(spec_id):
                    removed.append(spec_id)
                    log.info("removed a CDI spec no prepared claim refers to", extra=kv(
                        spec=str(self.cdi.spec_path(spec_id))))
            except CdiError as exc:
                log.warning("cannot remove orphan CDI spec", extra=kv(error=exc))
        if self.metadata is not None:
            try:
                pruned = self.metadata.prune((c.namespace, c.name) for c in self.store.claims())
            except OSError as exc:
                log.warning("cannot prune device metadata files", extra=kv(error=exc))
            else:
                if pruned:
                    log.info("removed device metadata files no prepared claim refers to", extra=kv(claims=pruned))
        return removed

    # -- prepare ---------------------------------------------------------------------------------------------------
    def claims_to_read(self, claims: Sequence[ClaimRef], *, locked: bool = False) -> list[ClaimRef]:
        """The claims a prepare of ``claims`` must read from the API server, once each: those not recorded as
        prepared. Before the plugin's locks this is what this process knows (one dict read per claim: safe beside a
        locked request's changes), so a slow API server holds up this request only; ``locked``, it first takes in
        what another process recorded or removed. Claims that fail their name check, or any claim while the
        checkpoint is unusable, are not read."""
        if locked:
            self.store.refresh()
        todo: dict[str, ClaimRef] = {}
        for claim in claims:
            if claim.uid in todo or self.store.error:
                continue
            try:
                check_claim_ref(claim)
            except ClaimError:
                continue
            existing = self.store.get(claim.uid)
            if existing is None or existing.state != STATE_COMPLETED:
                todo[claim.uid] = claim
        return list(todo.values())

    def prepare_blocking(self, claims: Sequence[ClaimRef], reads: ClaimReads
                         ) -> dict[str, list[PreparedDevice] | Exception]:
        """Prepare the claims of one request from the claims the plugin read (:meth:`claims_to_read`); each UID maps
        to its devices or its error (ClaimError, or anything unexpected for the caller to report as an internal
        error). The whole request is worked on in the calling thread (the DRA server's)."""
        out = self._prepare_many(claims, reads)
        for result in out.values():
            if isinstance(result, ClaimError):
                self.metrics.claim_errors.labels("prepare").inc()
        return out

    def _prepare_many(self, claims: Sequence[ClaimRef], given: ClaimReads
                      ) -> dict[str, list[PreparedDevice] | Exception]:
        out: dict[str, list[PreparedDevice] | Exception] = {}
        fresh: list[ClaimRef] = []
        known: list[PreparedClaim] = []  # prepared already
        self.store.refresh()  # what another process (the other pod of a rolling update) recorded meanwhile
        for claim in claims:
            if claim.uid in out or any(c.uid == claim.uid for c in fresh) or any(c.uid == claim.uid for c in known):
                continue  # the same claim twice in one request gets one answer
            try:
                check_claim_ref(claim)
                if self.store.error:
                    raise self._unusable()
            except ClaimError as exc:
                out[claim.uid] = exc
                continue
            existing = self.store.get(claim.uid)
            if existing is not None and existing.state == STATE_COMPLETED:
                known.append(existing)
            else:
                fresh.append(claim)
        out.update(self._answer_again(known))
        if not fresh:
            return out
        local_start = time.perf_counter()
        reads = [given[c.uid] if c.uid in given else _not_read() for c in fresh]
        plans = self._plan_all(fresh, reads, out)
        if plans:
            recorded = self._record(plans)
            self._answers(recorded, out)
            if self.notices is not None:
                self.notices.prepared([p for p in recorded.values() if isinstance(p, PreparedClaim)])
        self._observe_local(local_start)
        if self.notices is not None:
            self._report_problems(fresh, reads, out)
        return out

    def _report_problems(self, fresh: Sequence[ClaimRef], reads: Sequence[ResourceClaim | None | BaseException],
                         out: Mapping[str, list[PreparedDevice] | Exception]) -> None:
        """Tell the notices of the failed claims that were read, with devices of this driver here."""
        assert self.notices is not None
        problems = []
        for claim, data in zip(fresh, reads, strict=True):
            error = out.get(claim.uid)
            if not isinstance(error, Exception) or not isinstance(data, ResourceClaim):
                continue
            problem = problem_of(data, claim.uid, driver=self.driver_name, pool=self.node_name,
                                 reason=reason_of(error), cause=str(error))
            if problem is not None:
                problems.append(problem)
        if problems:
            self.notices.failed(problems)

    def _plan_all(self, fresh: Sequence[ClaimRef], reads: Sequence[ResourceClaim | None | BaseException],
                  out: dict[str, list[PreparedDevice] | Exception]) -> list[PreparedClaim]:
        """The plans of the claims read (``out`` gets the error of each claim that has none)."""
        start = time.perf_counter()
        plans: list[PreparedClaim] = []
        planned: dict[str, PreparedClaim] = {}  # device -> claim planned earlier in this request
        for claim, data in zip(fresh, reads, strict=True):
            try:
                if isinstance(data, BaseException):
                    raise data
                plan = self._plan(claim, data)
                for device in plan.held_devices:  # admin access (monitoring) neither blocks nor is blocked
                    holder = self.store.holder(device, other_than=claim.uid) or planned.get(device)
                    if holder is not None:
                        raise ClaimProblemError(f"device {device} is already prepared for claim "
                                                f"{holder.describe()}", DEVICE_IN_USE)
                try:
                    self.cdi.check(plan.uid, (name for name, _ in plan.cdi_devices()))
                except CdiError as exc:
                    raise ClaimError(str(exc)) from exc
            except Exception as exc:
                out[claim.uid] = exc
                continue
            plans.append(plan)
            planned.update((device, plan) for device in plan.held_devices)
        self.metrics.prepare_phase_seconds.labels("plan").observe(time.perf_counter() - start)
        return plans

    def _answers(self, recorded: Mapping[str, PreparedClaim | ClaimError],
                 out: dict[str, list[PreparedDevice] | Exception]) -> None:
        for uid, done in recorded.items():
            out[uid] = done if isinstance(done, Exception) else done.prepared_devices(self.cdi.qualified)

    def _observe_local(self, start: float) -> None:
        self.last_local_seconds = time.perf_counter() - start
        self.metrics.prepare_local_seconds.observe(self.last_local_seconds)

    def _guard(self) -> str | None:
        """Why no claim may be prepared now (the device-plugin guard, a directory listing), or None."""
        if self._blocked is None:
            return None
        start = time.perf_counter()
        try:
            return self._blocked()
        finally:
            self.metrics.prepare_phase_seconds.labels("guard").observe(time.perf_counter() - start)

    def unprepare_blocking(self, claims: Sequence[ClaimRef]) -> dict[str, Exception | None]:
        """Unprepare the claims of one request: their CDI specs, then one checkpoint write for all; each UID maps
        to None or its error."""
        return self._unprepare(claims)

    def _record(self, plans: Sequence[PreparedClaim]) -> dict[str, PreparedClaim | ClaimError]:
        """Check the guard (a blocked node fails every planned claim and records nothing), write the CDI specs,
        then record every claim whose spec was written with one durable journal record. When that write fails,
        the specs go again: no answer may refer to them. A kill in between is repaired at start
        (:meth:`remove_orphan_specs`)."""
        reason = self._guard()
        if reason:
            return {p.uid: ClaimProblemError(reason, DEVICE_PLUGIN_ACTIVE) for p in plans}
        failed = self._write_specs(plans)
        out: dict[str, PreparedClaim | ClaimError] = dict(failed)
        written = [p for p in plans if p.uid not in failed]
        if not written:
            return out
        try:
            self._save(written)
        except OSError as exc:
            for plan in written:
                self._drop_spec(plan)
            error = ClaimError(f"cannot record the prepared claim in checkpoint {self.store.path}: {exc}")
            out.update({p.uid: error for p in written})
        else:
            out.update({p.uid: p for p in written})
        return out

    def _answer_again(self, known: Sequence[PreparedClaim]) -> dict[str, list[PreparedDevice] | Exception]:
        """The answers of claims recorded as prepared: the same devices, their specs re-created if missing."""
        out: dict[str, list[PreparedDevice] | Exception] = {}
        for claim in known:
            try:
                self._ensure_spec(claim)
            except ClaimError as exc:
                out[claim.uid] = exc
                continue
            out[claim.uid] = claim.prepared_devices(self.cdi.qualified)
        return out

    def _unusable(self) -> ClaimError:
        return ClaimError(f"checkpoint {self.store.path} is unusable ({self.store.error}); refusing to prepare so "
                          "no device is handed out twice")

    def _write_specs(self, plans: Sequence[PreparedClaim]) -> dict[str, ClaimError]:
        """Every plan's CDI spec; the UIDs whose spec could not be written, with the error."""
        start = time.perf_counter()
        failed: dict[str, ClaimError] = {}
        for plan in plans:
            try:
                self.cdi.write(plan.uid, plan.cdi_devices())
            except CdiError as exc:
                failed[plan.uid] = ClaimError(f"cannot record the prepared claim: {exc}")
        self.metrics.prepare_phase_seconds.labels("cdi").observe(time.perf_counter() - start)
        return failed

    def _save(self, plans: Sequence[PreparedClaim]) -> None:
        """The one durable checkpoint write of a request (OSError propagates; the entries are rolled back)."""
        start = time.perf_counter()
        try:
            self.store.put_many(plans)
        finally:
            self.metrics.prepare_phase_seconds.labels("checkpoint").observe(time.perf_counter() - start)
            self._update_gauges()

    def _drop_spec(self, claim: PreparedClaim) -> None:
        try:
            self.cdi.remove(claim.uid)
        except CdiError as exc:  # the next start removes it as an orphan
            log.warning("cannot remove the CDI spec of an unrecorded claim", extra=kv(claim=claim.describe(),
                                                                                     error=exc))

    def _plan(self, claim: ClaimRef, data: ResourceClaim | None) -> PreparedClaim:
        """Which devices and edits each request gets (ClaimError for anything wrong with the claim)."""
        alloc = allocated_for_node(data, claim, driver=self.driver_name, pool=self.node_name)
        chosen = alloc.allocated_requests  # a config may name the request or the subrequest the allocator chose
        try:
            configs = configs_for_requests(alloc.configs, list(chosen.values()), driver=self.driver_name,
                                           decode=self.profile.decode_config, default=self.profile.default_config)
        except ConfigError as exc:
            raise ClaimProblemError(str(exc), INVALID_CONFIG) from exc
        inventory = self.inventory
        requests = []
        status: list[tuple[str, DeviceStatusData]] = []
        for request in alloc.requests:
            results = [d for d in alloc.devices if d.request == request]
            try:
                edits = self.profile.container_edits(inventory, request, [d.device for d in results],
                                                     configs[chosen[request]])
            except ClaimError as exc:
                raise ClaimProblemError(str(exc), self._edits_reason(str(exc), results)) from exc
            order = tuple(edits.devices)
            request_edits = edits.request
            if self.metadata is not None:
                mount = self._write_metadata(claim, data, chosen[request], results, edits)
                request_edits = dataclasses.replace(request_edits, mounts=(*request_edits.mounts, mount))
            requests.append(PreparedRequest(request, order, tuple((d, edits.devices[d]) for d in order),
                                            request_edits, all(d.admin_access for d in results)))
            status.extend((d, edits.status[d]) for d in order if d in edits.status)
        return PreparedClaim(claim.uid, claim.namespace, claim.name, alloc.devices[0].pool, tuple(requests),
                             STATE_COMPLETED, tuple(status))

    def _write_metadata(self, claim: ClaimRef, data: ResourceClaim | None, request: str,
                        results: Sequence[AllocatedDevice], edits: RequestEdits) -> Mount:
        """Write one request's device metadata file; the mount that puts it in the containers of the request. A
        claim that is refused later keeps its file until it is unprepared or the driver restarts (orphans go then)."""
        assert self.metadata is not None
        annotations = data.metadata.annotations if data is not None and data.metadata is not None else None
        identity = ClaimIdentity.of(claim.namespace, claim.name, claim.uid, annotations)
        devices = []
        for d in results:
            status = edits.status.get(d.device)
            # what the claim's status says of the device (scalars), under what the slice publishes, under what
            # the profile adds for the container
            published = self._published.get(d.device, {})
            said = {k: v for k, v in (status.data.items() if status else ())
                    if isinstance(v, bool | int | str) and k not in published}
            devices.append(MetadataDevice(d.pool, d.device, {**said, **edits.metadata.get(d.device, {})},
                                          status.network if status else None, published))
        try:
            return self.metadata.write(identity, request, devices)
        except (OSError, ValueError) as exc:
            raise ClaimError(f"cannot write the device metadata file of request {request}: {exc}") from exc

    def _edits_reason(self, message: str, results: Sequence[AllocatedDevice]) -> str:
        """Why the profile refused a request: the profiles name the device first ("device X ...") when a device is
        the problem (unhealthy, by this driver's health, or else not usable), and the request first when its config
        does not fit the node."""
        for result in results:
            if message.startswith(f"device {result.device} "):
                health = self._health.get(result.device)
                return DEVICE_UNHEALTHY if health is not None and not health.healthy else DEVICE_NOT_USABLE
        return DEVICE_NOT_USABLE if message.startswith("device ") else INVALID_CONFIG

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
    def _unprepare(self, claims: Sequence[ClaimRef]) -> dict[str, Exception | None]:
        out: dict[str, Exception | None] = {}
        self.store.refresh()  # another process may have recorded (or removed) these claims meanwhile
        removed_specs: list[str] = []
        for claim in claims:
            out[claim.uid] = None
            if not is_uid(claim.uid):  # checked before any path is built: no spec of ours has such a name
                log.info("unprepare of a claim UID that is not a Kubernetes UID: no CDI spec to remove", extra=kv(
                    claim=str(claim), rule=UID_RULE))
                continue  # an entry an older driver recorded under it, unchecked, is still dropped below
            try:
                if self.cdi.remove(claim.uid):
                    removed_specs.append(claim.uid)
            except CdiError as exc:  # the spec stays usable: keep the entry (its devices stay held), fail the claim
                out[claim.uid] = ClaimError(f"{exc}; the claim stays prepared until the kubelet retries")
        failed = [uid for uid, error in out.items() if error is not None]
        if failed:
            self.metrics.claim_errors.labels("unprepare").inc(len(failed))
        if self.store.error:
            log.warning("checkpoint unusable; removed the CDI specs only", extra=kv(claims=[str(c) for c in claims]))
            self._remove_metadata(claims, out)
            return out
        try:
            removed = self.store.remove_many([c.uid for c in claims if out[c.uid] is None])
        except OSError as exc:  # every entry stays; a claim that had none is unprepared all the same
            kept = self._respec(removed_specs)
            error = ClaimError(f"cannot update checkpoint {self.store.path}: {exc}; {kept}, and the kubelet retries")
            stayed = [uid for uid, result in out.items() if result is None and self.store.get(uid) is not None]
            self.metrics.claim_errors.labels("unprepare").inc(len(stayed))
            out = {uid: error if uid in stayed else result for uid, result in out.items()}
            self._remove_metadata(claims, out)  # the claims that stay prepared keep their files, as their specs
            return out
        self._remove_metadata(claims, out)
        for claim in claims:
            if claim.uid not in removed:
                log.debug("unprepare of an unknown claim: nothing to do", extra=kv(claim=str(claim)))
        self._update_gauges()
        return out

    def _remove_metadata(self, claims: Sequence[ClaimRef], out: Mapping[str, Exception | None]) -> None:
        """The device metadata files of the claims unprepared (``out`` None), once their CDI specs and entries are
        gone: a claim that stays prepared keeps the file its spec mounts."""
        if self.metadata is None:
            return
        # files go by namespace and name: one a claim of another UID (created again under the name) still holds stays
        held = {(c.namespace, c.name) for c in self.store.claims()}
        for claim in claims:
            if out.get(claim.uid) is not None or not is_uid(claim.uid) or (claim.namespace, claim.name) in held:
                continue
            try:
                self.metadata.remove(claim.namespace, claim.name)
            except (OSError, ValueError) as exc:  # a leftover file (or a name no file has): the next start prunes
                log.warning("cannot remove the claim's device metadata files", extra=kv(claim=str(claim), error=exc))

    def _respec(self, uids: Sequence[str]) -> str:
        """Put back the CDI specs an unprepare removed before its checkpoint write failed, from the entries that
        stayed, so each claim is prepared as before (entry and spec) until the kubelet retries; says what was done.
        A spec that cannot be written either leaves its entry without one: its devices stay held, and a prepare
        re-creates the spec before it answers (:meth:`_ensure_spec`), as start does (:meth:`restore`)."""
        lost = []
        for uid in uids:
            claim = self.store.get(uid)
            if claim is None or claim.state != STATE_COMPLETED:
                continue
            try:
                self.cdi.write(uid, claim.cdi_devices())
            except CdiError as exc:
                lost.append(claim.describe())
                log.error("cannot put back the CDI spec of a claim that stays prepared; a prepare re-creates it",
                          extra=kv(claim=claim.describe(), error=cut(exc)))
        if lost:
            return "the claim stays prepared (its CDI spec is re-created before a prepare answers)"
        return "the claim stays prepared (CDI spec put back)"

    # -- health ----------------------------------------------------------------------------------------------------
    def set_health(self, health: Mapping[str, DeviceHealth]) -> bool:
        """Record the health of every published device (in pool order); True when it changed."""
        changed = self._health.set(health)
        self.metrics.devices.set(len(health))
        for name, state in health.items():
            self.metrics.device_healthy.labels(name).set(1 if state.healthy else 0)
        return changed

    def health(self) -> list[DeviceHealthReport] | None:
        return [DeviceHealthReport(self.node_name, name, state.healthy, state.message, HEALTH_TIMEOUT_SECONDS)
                for name, state in self._health.items()]

    def _update_gauges(self) -> None:
        claims = self.store.claims()
        self.metrics.prepared_claims.set(len(claims))
        self.metrics.prepared_devices.set(sum(len(c.held_devices) for c in claims))
