"""Reading a ResourceClaim from the API server and reducing it to what this node must prepare.

The kubelet names a claim by namespace, name and UID. The claim is read fresh (never from a cache), and it must
still be the same object (same UID) and be allocated. Only results for this driver in this node's pool count.
Names are checked (:mod:`accel_core.k8snames`) before a request is made; only checked names go into the request
path (built by :mod:`accel_core.dra.claimget` or by lightkube). Either way the answer is decoded into lightkube's
typed ``ResourceClaim``, and a body of the wrong shape (a list where an object belongs, a number for a name, a
missing required field) is a ClaimError naming the bad field, like every other problem with the claim.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import msgspec
from lightkube import ApiError, AsyncClient
from lightkube.resources.resource_v1 import ResourceClaim

from accel_core.dra.claimget import DirectClaimGet
from accel_core.dra.config import OpaqueEntry
from accel_core.dra.types import ClaimError, ClaimRef
from accel_core.k8snames import claim_ref_problem, is_label, is_request_name, object_name_problem, shown


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


class ClaimReader(Protocol):
    """Reads claims. A reader may also offer ``read_blocking(namespace, name)``, the same read for a worker
    thread (None when it has none): a one-claim prepare then reads, plans and records in one thread."""

    async def read(self, namespace: str, name: str) -> ResourceClaim | None:
        """The claim, or None when it does not exist."""
        ...


class ApiClaimReader:
    """Reads claims with ``direct`` (claimget.py) when given, else with lightkube; remembers how long the last read
    took (for metrics and benchmarks)."""

    def __init__(self, client: AsyncClient, direct: DirectClaimGet | None = None) -> None:
        self.client = client
        self.direct = direct
        self.last_seconds = 0.0
        #: The direct read, for a worker thread (lightkube's client belongs to the event loop).
        self.read_blocking: Callable[[str, str], ResourceClaim | None] | None = \
            self._read_direct if direct is not None else None

    async def read(self, namespace: str, name: str) -> ResourceClaim | None:
        if self.direct is not None:
            return await asyncio.to_thread(self._read_direct, namespace, name)
        _check_names(namespace, name)
        start = time.perf_counter()
        try:
            return await self.client.get(ResourceClaim, name, namespace=namespace)
        except ApiError as exc:
            if exc.status.code == 404:
                return None
            raise ClaimError(f"reading the claim from the API server failed: HTTP {exc.status.code}: "
                             f"{exc.status.message}") from exc
        except msgspec.DecodeError as exc:  # not JSON, or not a ResourceClaim (msgspec.ValidationError)
            raise ClaimError(f"the API server sent a malformed claim: {exc}") from exc
        except Exception as exc:  # transport errors: the kubelet retries the whole call later
            raise ClaimError(f"reading the claim from the API server failed: {type(exc).__name__}: {exc}") from exc
        finally:
            self.last_seconds = time.perf_counter() - start

    def _read_direct(self, namespace: str, name: str) -> ResourceClaim | None:
        assert self.direct is not None
        _check_names(namespace, name)
        start = time.perf_counter()
        try:
            return self.direct.get(namespace, name)
        finally:
            self.last_seconds = time.perf_counter() - start


def check_claim_ref(ref: ClaimRef) -> None:
    """ClaimError for a reference that cannot name a ResourceClaim."""
    problem = claim_ref_problem(ref.namespace, ref.name, ref.uid)
    if problem:
        raise ClaimError(f"invalid claim reference: {problem}")


def _check_names(namespace: str, name: str) -> None:
    problem = object_name_problem(namespace, name)  # never put an unchecked name in a request path
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
