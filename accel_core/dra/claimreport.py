"""Claim problems where users look: the bodies a driver sends when a claim cannot be prepared, or a prepared
device turns unhealthy (the writer is :mod:`accel_core.dra.reporter`).

- ``status.devices[].conditions``: a ``Ready`` condition per allocated device of this driver in this node's pool
  (the API server accepts entries for allocated devices only), ``False`` with a CamelCase reason and a message
  naming the claim, the device and the cause; ``True`` again once prepared or healthy.
- An ``events.k8s.io/v1`` Warning Event regarding each Pod in the claim's ``status.reservedFor``, related to the
  claim, with ``reportingController`` the driver name and ``reportingInstance`` the node.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from lightkube.resources.resource_v1 import ResourceClaim

from accel_core.dra.prepared import PreparedClaim
from accel_core.dra.types import ClaimError
from accel_core.health import DeviceHealth

API_VERSION = "resource.k8s.io/v1"
READY = "Ready"
#: Condition and Event reasons (CamelCase, as metav1.Condition requires).
PREPARED = "Prepared"
INVALID_CONFIG = "InvalidConfig"
DEVICE_NOT_USABLE = "DeviceNotUsable"
DEVICE_UNHEALTHY = "DeviceUnhealthy"
DEVICE_IN_USE = "DeviceInUse"
DEVICE_PLUGIN_ACTIVE = "DevicePluginActive"
PREPARE_FAILED = "PrepareFailed"
PREPARED_MESSAGE = "prepared on this node; CDI devices written"
#: Limits of the API: an Event's note is at most 1 KiB; a condition message 32 KiB (kept far shorter here).
NOTE_LIMIT = 1024
MESSAGE_LIMIT = 4096
EVENT_ACTION = "PrepareResourceClaim"


class ClaimProblemError(ClaimError):
    """A ClaimError that knows its condition reason."""

    def __init__(self, message: str, reason: str) -> None:
        super().__init__(message)
        self.reason = reason


def reason_of(exc: BaseException) -> str:
    return exc.reason if isinstance(exc, ClaimProblemError) else PREPARE_FAILED


@dataclass(frozen=True)
class PodRef:
    name: str
    uid: str


@dataclass(frozen=True)
class ClaimProblem:
    """A claim this node could not prepare: its allocated devices of this driver and pool, the pods waiting on
    it, and why."""

    namespace: str
    name: str
    uid: str
    devices: tuple[tuple[str, str, str | None], ...]  # (pool, device, shareID)
    pods: tuple[PodRef, ...]
    reason: str
    cause: str

    def describe(self) -> str:
        return f"{self.namespace}/{self.name} (uid {self.uid})"


def problem_of(claim: ResourceClaim, uid: str, *, driver: str, pool: str, reason: str, cause: str
               ) -> ClaimProblem | None:
    """The problem of ``claim`` (read from the API server; its UID must be ``uid``), or None when it has no
    allocated device of ``driver`` in ``pool`` (then there is no status entry the API server would accept)."""
    meta, status = claim.metadata, claim.status
    if meta is None or meta.uid != uid or not meta.name or not meta.namespace or status is None:
        return None
    allocation = status.allocation
    results = (allocation.devices.results if allocation is not None and allocation.devices else None) or []
    devices = tuple(dict.fromkeys((r.pool, r.device, r.shareID) for r in results
                                  if r.driver == driver and r.pool == pool))
    if not devices:
        return None
    pods = tuple(PodRef(r.name, r.uid) for r in status.reservedFor or ()
                 if r.resource == "pods" and not r.apiGroup and r.name and r.uid)
    return ClaimProblem(meta.namespace, meta.name, uid, devices, pods, reason, cause)


def stamp(now: datetime) -> str:
    return now.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def micro_stamp(now: datetime) -> str:
    return now.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _clip(text: str, limit: int) -> str:
    raw = text.encode()
    if len(raw) <= limit:
        return text
    return raw[:limit - 3].decode(errors="ignore") + "..."


def condition(ok: bool, reason: str, message: str, now: datetime) -> dict[str, Any]:
    return {"type": READY, "status": "True" if ok else "False", "reason": reason,
            "message": _clip(message, MESSAGE_LIMIT), "lastTransitionTime": stamp(now)}


def ready_condition(claim: str, device: str, node: str, health: DeviceHealth | None, now: datetime
                    ) -> dict[str, Any]:
    """A prepared device's Ready condition: True, or False while the device is unhealthy."""
    if health is None or health.healthy:
        return condition(True, PREPARED, PREPARED_MESSAGE, now)
    why = f" ({health.reason})" if health.reason else ""
    return condition(False, DEVICE_UNHEALTHY, f"claim {claim}: device {device} on node {node} is unhealthy{why}: "
                     f"{health.message or 'no detail'}", now)


def _body(namespace: str, name: str, uid: str, entries: list[dict[str, Any]]) -> dict[str, Any]:
    return {"apiVersion": API_VERSION, "kind": "ResourceClaim",
            "metadata": {"name": name, "namespace": namespace, "uid": uid}, "status": {"devices": entries}}


def problem_status_patch(problem: ClaimProblem, driver: str, node: str, now: datetime) -> dict[str, Any]:
    """The server-side apply body: Ready=False on each of the claim's devices of this driver."""
    entries = []
    for pool, device, share in problem.devices:
        entry: dict[str, Any] = {"driver": driver, "pool": pool, "device": device, "conditions": [condition(
            False, problem.reason, f"claim {problem.namespace}/{problem.name}: device {device} not prepared on "
            f"node {node}: {problem.cause}", now)]}
        if share:
            entry["shareID"] = share
        entries.append(entry)
    return _body(problem.namespace, problem.name, problem.uid, entries)


def health_status_patch(claim: PreparedClaim, driver: str, node: str,
                        health: Callable[[str], DeviceHealth | None], now: datetime) -> dict[str, Any]:
    """The server-side apply body of a prepared claim's Ready conditions only (its own field manager, so the
    ``data`` the prepare wrote stays)."""
    entries = [{"driver": driver, "pool": claim.pool, "device": device,
                "conditions": [ready_condition(f"{claim.namespace}/{claim.name}", device, node, health(device),
                                               now)]}
               for device in dict.fromkeys(claim.devices)]
    return _body(claim.namespace, claim.name, claim.uid, entries)


def event_name(pod: str, key: str) -> str:
    """A name per pod and problem (``key``): a repeat updates the same Event."""
    digest = hashlib.sha256(key.encode()).hexdigest()[:16]
    return f"{pod[:253 - 17]}.{digest}"


def event_body(problem: ClaimProblem, pod: PodRef, *, name: str, driver: str, node: str, first: datetime,
               count: int = 1, last: datetime | None = None) -> dict[str, Any]:
    """A Warning Event on ``pod``, related to the claim; ``count`` > 1 adds the series."""
    body: dict[str, Any] = {
        "apiVersion": "events.k8s.io/v1", "kind": "Event",
        "metadata": {"name": name, "namespace": problem.namespace},
        "eventTime": micro_stamp(first), "type": "Warning", "reason": problem.reason, "action": EVENT_ACTION,
        "reportingController": driver, "reportingInstance": node[:128],
        "regarding": {"apiVersion": "v1", "kind": "Pod", "namespace": problem.namespace, "name": pod.name,
                      "uid": pod.uid},
        "related": {"apiVersion": API_VERSION, "kind": "ResourceClaim", "namespace": problem.namespace,
                    "name": problem.name, "uid": problem.uid},
        "note": _clip(f"{driver} cannot prepare claim {problem.namespace}/{problem.name} on node {node}: "
                      f"{problem.cause}", NOTE_LIMIT)}
    if count > 1:
        body["series"] = {"count": count, "lastObservedTime": micro_stamp(last or first)}
    return body


def health_changes(seen: Mapping[str, bool], now: Mapping[str, DeviceHealth]) -> set[str]:
    """Devices whose healthy flag differs from ``seen`` (a device not in either counts as healthy)."""
    return {d for d in set(seen) | set(now) if seen.get(d, True) != (now[d].healthy if d in now else True)}
