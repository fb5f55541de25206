"""Reading a ResourceClaim from the API server and reducing it to what this node must prepare.

The kubelet names a claim by namespace, name and UID. The claim is read fresh (never from a cache), blocking, in
the DRA server's thread that then prepares it (the plugin reads, :class:`ClaimReader`; the handler receives the
objects), and it must still be the same object (same UID) and be allocated. Only results for this driver in this
node's pool count. Names are checked (:mod:`accel_core.k8snames`) before a request is made; only checked names go
into the request path (built by :mod:`accel_core.dra.claimget`, h11, or by lightkube's sync client where that does
not apply). Either way the answer is decoded into lightkube's typed ``ResourceClaim``, and a body of the wrong
shape (a list where an object belongs, a number for a name, a missing required field) is a ClaimError naming the
bad field, like every other problem with the claim.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Protocol

import msgspec
from lightkube import ApiError, Client
from lightkube.config.kubeconfig import SingleConfig
from lightkube.resources.resource_v1 import ResourceClaim

from accel_core.dra.claimget import DirectClaimGet
from accel_core.dra.config import OpaqueEntry
from accel_core.dra.metrics import DriverMetrics
from accel_core.dra.types import ClaimError, ClaimRef
from accel_core.k8snames import claim_ref_problem, is_label, is_request_name, object_name_problem, shown

#: Claims of one request read at once, at most.
MAX_PARALLEL_READS = 8


@dataclass(frozen=True)
class AllocatedDevice:
    """One allocation result for this driver on this node. ``request`` is the base request name; ``admin_access``
    is the result's ``adminAccess`` (a monitoring claim that holds no device)."""

    request: str
    pool: str
    device: str
    admin_access: bool = False
    subrequest: str | None = None  # the prioritized list's choice (``request/subrequest``), if any


@dataclass(frozen=True)
class AllocatedClaim:
    ref: ClaimRef
    devices: tuple[AllocatedDevice, ...]
    configs: tuple[OpaqueEntry, ...]

    @property
    def requests(self) -> tuple[str, ...]:
        """Request names in first-seen order."""
        return tuple(dict.fromkeys(d.request for d in self.devices))

    @property
    def allocated_requests(self) -> dict[str, str]:
        """Request name -> the name its results carry: ``request/subrequest`` when a prioritized list chose a
        subrequest (a config may name either), else the request name."""
        return {d.request: f"{d.request}/{d.subrequest}" if d.subrequest else d.request for d in self.devices}


class ClaimGet(Protocol):
    """One claim GET, blocking (a worker thread): the claim, None when the API server has none, ClaimError for any
    other failure. Names are checked before it is called."""

    def get(self, namespace: str, name: str) -> ResourceClaim | None: ...

    def close(self) -> None: ...


class LightkubeClaimGet:
    """The claim GET through lightkube's sync client, for the kubeconfigs the h11 GET does not speak (exec plugins,
    basic auth, an auth provider, a proxy)."""

    def __init__(self, client: Client) -> None:
        self.client = client

    def get(self, namespace: str, name: str) -> ResourceClaim | None:
        try:
            return self.client.get(ResourceClaim, name, namespace=namespace)
        except ApiError as exc:
            if exc.status.code == 404:
                return None
            raise ClaimError(f"reading the claim from the API server failed: HTTP {exc.status.code}: "
                             f"{exc.status.message}") from exc
        except msgspec.DecodeError as exc:  # not JSON, or not a ResourceClaim (msgspec.ValidationError)
            raise ClaimError(f"the API server sent a malformed claim: {exc}") from exc
        except Exception as exc:  # transport errors: the kubelet retries the whole call later
            raise ClaimError(f"reading the claim from the API server failed: {type(exc).__name__}: {exc}") from exc

    def close(self) -> None:
        self.client.close()


class NoApiClaimGet:
    """No API server is configured: every read fails the claim, saying so."""

    def get(self, namespace: str, name: str) -> ResourceClaim | None:
        raise ClaimError("no API server connection is configured (KUBECONFIG or in-cluster), so claims cannot be read")

    def close(self) -> None:
        pass


def claim_get_for(config: SingleConfig, *, keepalive: float, field_manager: str) -> ClaimGet:
    """The claim GET for a kubeconfig: h11 (:mod:`accel_core.dra.claimget`) where it applies, else lightkube's."""
    direct = DirectClaimGet.from_config(config, keepalive=keepalive)
    return direct if direct is not None else LightkubeClaimGet(Client(config, field_manager=field_manager))


class ClaimReader:
    """Reads the claims of a prepare, blocking (the plugin calls it in a DRA server thread) or one at a time (the
    stale-claim cleanup, in a worker thread): names checked before any request, several claims at once on a few
    threads, each read timed (``<prefix>_claim_read_duration_seconds``; :attr:`last_seconds`)."""

    def __init__(self, get: ClaimGet, metrics: DriverMetrics | None = None) -> None:
        self.api = get
        self.metrics = metrics
        self.last_seconds = 0.0

    def read(self, namespace: str, name: str) -> ResourceClaim | None:
        """The claim, or None when it does not exist (ClaimError for an unusable name, before any request)."""
        problem = object_name_problem(namespace, name)  # never put an unchecked name in a request path
        if problem:
            raise ClaimError(f"invalid claim reference: {problem}")
        start = time.perf_counter()
        try:
            return self.api.get(namespace, name)
        finally:
            self.last_seconds = time.perf_counter() - start
            if self.metrics is not None:
                self.metrics.claim_read_seconds.observe(self.last_seconds)

    def read_all(self, claims: Sequence[ClaimRef]) -> dict[str, ResourceClaim | None | BaseException]:
        """Each claim (several at once, in order) or the exception its read raised, by UID."""
        if not claims:
            return {}
        start = time.perf_counter()
        if len(claims) == 1:
            reads = [self._read_one(claims[0])]
        else:
            with ThreadPoolExecutor(max_workers=min(len(claims), MAX_PARALLEL_READS),
                                    thread_name_prefix="claim-read") as pool:
                reads = list(pool.map(self._read_one, claims))
        if self.metrics is not None:
            self.metrics.prepare_phase_seconds.labels("read").observe(time.perf_counter() - start)
        return {c.uid: read for c, read in zip(claims, reads, strict=True)}

    def _read_one(self, claim: ClaimRef) -> ResourceClaim | None | BaseException:
        try:
            return self.read(claim.namespace, claim.name)
        except Exception as exc:
            return exc


def check_claim_ref(ref: ClaimRef) -> None:
    """ClaimError for a reference that cannot name a ResourceClaim."""
    problem = claim_ref_problem(ref.namespace, ref.name, ref.uid)
    if problem:
        raise ClaimError(f"invalid claim reference: {problem}")


def allocated_for_node(claim: ResourceClaim | None, ref: ClaimRef, *, driver: str, pool: str) -> AllocatedClaim:
    """Check the claim read from the API server against the kubelet's reference and keep this node's results."""
    if claim is None:
        raise ClaimError("the claim does not exist in the API server")
    uid = claim.metadata.uid if claim.metadata else None
    if uid != ref.uid:
        raise ClaimError(f"the claim was replaced: the API server has UID {uid}, the kubelet asked for {ref.uid}")
    allocated = claim.status.allocation if claim.status else None
    if allocated is None:
        raise ClaimError("the claim is not allocated")
    results = (allocated.devices.results if allocated.devices else None) or []
    mine = []
    for r in results:
        if r.driver != driver or r.pool != pool:
            continue
        if not is_request_name(r.request):
            raise ClaimError(f"allocation result request name {shown(r.request)} is not a DNS label "
                             "(or request/subrequest)")
        if not is_label(r.device):
            raise ClaimError(f"allocation result device name {shown(r.device)} is not a DNS label")
        base, _, sub = r.request.partition("/")
        mine.append(AllocatedDevice(base, pool, r.device, r.adminAccess is True, sub or None))
    if not mine:
        others = sorted({f"{r.driver}/{r.pool}" for r in results})
        raise ClaimError(f"the allocation has no devices of {driver} in pool {pool} (results: "
                         f"{', '.join(others) or 'none'})")
    configs = (allocated.devices.config if allocated.devices else None) or []
    return AllocatedClaim(ref, tuple(mine), tuple(OpaqueEntry.from_api(c) for c in configs))
