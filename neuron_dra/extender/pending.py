"""Which pods a filter may reserve for: pods the API server shows unbound and naming this scheduler.

A filter body is only a claim. Before a reservation the service checks the claimed pod here: first in an index of
unbound pods with ``spec.schedulerName`` = this scheduler (kept by a pod watch with those field selectors, so a
lookup costs nothing), else, for a pod created a moment ago that the watch has not delivered, one GET of the pod
(a few at a time, with a timeout). The reservation then counts the requests the API server has, not the body's.
A claim that fails is remembered for a while, so repeating it costs no further GET.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

from lightkube import ApiError, AsyncClient
from lightkube.resources.core_v1 import Pod

from accel_core.logs import kv
from neuron_dra.extender.decide import TERMINAL
from neuron_dra.extender.podspec import BadInput, PodInfo, pod_info

log = logging.getLogger(__name__)

#: reasons a claim is refused (metric label values)
NO_API = "no_api"
UNKNOWN = "unknown_pod"
BOUND = "bound"
OTHER_SCHEDULER = "other_scheduler"
LOOKUP_FAILED = "lookup_failed"


def refusal(raw: dict[str, Any], claimed: PodInfo, scheduler: str) -> str:
    """Why the API server's pod ``raw`` does not back the claim (empty when it does)."""
    meta, spec = raw.get("metadata") or {}, raw.get("spec") or {}
    if meta.get("uid") != claimed.uid or meta.get("deletionTimestamp"):
        return UNKNOWN
    if spec.get("nodeName") or (raw.get("status") or {}).get("phase") in TERMINAL:
        return BOUND
    if (spec.get("schedulerName") or "default-scheduler") != scheduler:
        return OTHER_SCHEDULER
    return ""


class PendingPods:
    """The unbound pods of one scheduler, by UID, and :meth:`verify` for a filter's claimed pod."""

    def __init__(self, client: AsyncClient | None, scheduler: str, *, lookup_timeout: float = 2.0,
                 parallel_lookups: int = 4, remember_refusals: float = 30.0, max_refusals: int = 4096,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.client = client
        self.scheduler = scheduler
        self.lookup_timeout = lookup_timeout
        self.remember_refusals = remember_refusals
        self.max_refusals = max_refusals
        self._clock = clock
        self._lookups = asyncio.Semaphore(parallel_lookups)
        #: uid -> pod, from the watch of unbound pods naming this scheduler
        self.pods: dict[str, PodInfo] = {}
        self._refused: OrderedDict[str, tuple[float, str]] = OrderedDict()

    # -- the index (fed by the watch) ----------------------------------------------------------------------------
    def seen(self, raw: dict[str, Any]) -> None:
        try:
            pod = pod_info(raw)
        except BadInput:
            return
        if refusal(raw, pod, self.scheduler):
            self.pods.pop(pod.uid, None)
        else:
            self.pods[pod.uid] = pod
            self._refused.pop(pod.uid, None)

    def gone(self, uid: str) -> None:
        self.pods.pop(uid, None)

    def reset(self) -> None:
        self.pods = {}

    # -- claims ----------------------------------------------------------------------------------------------------
    async def verify(self, claimed: PodInfo) -> tuple[PodInfo | None, str]:
        """(the API server's view of the pod, "") when a reservation may be made for it, else (None, reason)."""
        if self.client is None:
            return None, NO_API
        hit = self.pods.get(claimed.uid)
        if hit is not None and hit.key == claimed.key:
            return hit, ""
        now = self._clock()
        remembered = self._refused.get(claimed.uid)
        if remembered is not None and remembered[0] > now:
            return None, remembered[1]
        namespace, _, name = claimed.key.partition("/")
        try:
            async with self._lookups:
                obj = await asyncio.wait_for(self.client.get(Pod, name, namespace=namespace), self.lookup_timeout)
            raw = obj.to_dict()
        except ApiError as exc:
            if exc.status.code != 404:
                log.warning("cannot look up a filtered pod", extra=kv(pod=claimed.key, error=str(exc)[:200]))
                return None, LOOKUP_FAILED
            raw = {}
        except Exception as exc:  # timeouts, connection errors: no reservation this time, nothing remembered
            log.warning("cannot look up a filtered pod", extra=kv(pod=claimed.key, error=repr(exc)[:200]))
            return None, LOOKUP_FAILED
        reason = refusal(raw, claimed, self.scheduler)
        if reason:
            self._refused[claimed.uid] = (now + self.remember_refusals, reason)
            self._refused.move_to_end(claimed.uid)
            while len(self._refused) > self.max_refusals:
                self._refused.popitem(last=False)
            return None, reason
        try:
            return pod_info(raw), ""
        except BadInput:
            return None, UNKNOWN
