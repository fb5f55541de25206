"""Reading a ResourceClaim from the API server and reducing it to what this node must prepare.

The kubelet names a claim by namespace, name and UID. The claim is read fresh (never from a cache), and it must
still be the same object (same UID) and be allocated. Only results for this driver in this node's pool count.
Names are checked (:mod:`accel_core.dra.names`) before a request is made, and lightkube builds the request path
from the resource type, namespace and name.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from lightkube import ApiError, AsyncClient
from lightkube.resources.resource_v1 import ResourceClaim

from accel_core.dra.config import OpaqueEntry
from accel_core.dra.names import is_label, is_request_name, object_name_problem, shown
from accel_core.dra.types import ClaimError, ClaimRef


@dataclass(frozen=True)
class AllocatedDevice:
    """One allocation result for this driver on this node. ``request`` is the base request name."""

    request: str
    pool: str
    device: str


@dataclass(frozen=True)
class AllocatedClaim:
    ref: ClaimRef
    devices: tuple[AllocatedDevice, ...]
    configs: tuple[OpaqueEntry, ...]

    @property
    def requests(self) -> tuple[str, ...]:
        """Request names in first-seen order."""
        return tuple(dict.fromkeys(d.request for d in self.devices))


class ClaimReader(Protocol):
    async def read(self, namespace: str, name: str) -> Mapping[str, Any] | None:
        """The claim as a dict, or None when it does not exist."""
        ...


class ApiClaimReader:
    """Reads claims with lightkube; remembers how long the last read took (for metrics and benchmarks)."""

    def __init__(self, client: AsyncClient) -> None:
        self.client = client
        self.last_seconds = 0.0

    async def read(self, namespace: str, name: str) -> Mapping[str, Any] | None:
        problem = object_name_problem(namespace, name)  # never put an unchecked name in a request path
        if problem:
            raise ClaimError(f"invalid claim reference: {problem}")
        start = time.perf_counter()
        try:
            obj = await self.client.get(ResourceClaim, name, namespace=namespace)
        except ApiError as exc:
            if exc.status.code == 404:
                return None
            raise ClaimError(f"reading the claim from the API server failed: HTTP {exc.status.code}: "
                             f"{exc.status.message}") from exc
        except Exception as exc:  # transport errors: the kubelet retries the whole call later
            raise ClaimError(f"reading the claim from the API server failed: {type(exc).__name__}: {exc}") from exc
        finally:
            self.last_seconds = time.perf_counter() - start
        data: dict[str, Any] = obj.to_dict()
        return data


def allocated_for_node(claim: Mapping[str, Any] | None, ref: ClaimRef, *, driver: str, pool: str) -> AllocatedClaim:
    """Check the claim read from the API server against the kubelet's reference and keep this node's results."""
    if claim is None:
        raise ClaimError("the claim does not exist in the API server")
    uid = (claim.get("metadata") or {}).get("uid")
    if uid != ref.uid:
        raise ClaimError(f"the claim was replaced: the API server has UID {uid}, the kubelet asked for {ref.uid}")
    allocation = (claim.get("status") or {}).get("allocation")
    if not allocation:
        raise ClaimError("the claim is not allocated")
    device_alloc = allocation.get("devices") or {}
    results = device_alloc.get("results") or []
    configs = device_alloc.get("config") or []
    if not isinstance(results, list) or not all(isinstance(r, Mapping) for r in results) or \
            not isinstance(configs, list) or not all(isinstance(c, Mapping) for c in configs):
        raise ClaimError("the claim's status.allocation.devices is malformed (results/config are not lists of "
                         "objects)")
    mine = []
    for r in results:
        if r.get("driver") != driver or r.get("pool") != pool:
            continue
        request, device = r.get("request"), r.get("device")
        if not is_request_name(request):
            raise ClaimError(f"allocation result request name {shown(request)} is not a DNS label "
                             "(or request/subrequest)")
        if not is_label(device):
            raise ClaimError(f"allocation result device name {shown(device)} is not a DNS label")
        mine.append(AllocatedDevice(str(request).split("/", 1)[0], pool, str(device)))
    if not mine:
        others = sorted({f"{r.get('driver')}/{r.get('pool')}" for r in results})
        raise ClaimError(f"the allocation has no devices of {driver} in pool {pool} (results: "
                         f"{', '.join(others) or 'none'})")
    return AllocatedClaim(ref, tuple(mine), tuple(OpaqueEntry.from_api(c) for c in configs))
