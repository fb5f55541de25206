"""The extender's decisions: filter and prioritize for one pod over the nodes the scheduler sends.

Truth about a node is its device-usage annotation (written by the node's device plugin). On top of it the extender
adds only what the node cannot have reported yet, and keeps nothing that could go stale:

- pods bound to the node (seen in the pod watch) that the annotation does not list yet, and
- pods this extender passed to the node in the last ``reserve_for`` seconds that are not bound anywhere yet (the
  scheduler may be binding one while it asks about the next), on every node it passed them to with a usable
  annotation (reservations.py; the service reserves only for pods the API server shows pending for this scheduler).

Both are placed with the device plugin's own policy, in creation order, before the pod in question. A node without
an annotation (device plugin not publishing yet) passes with the lowest score: a restart or a reinstall of either
side never blocks scheduling. So does a node whose allocatable offers neither resource: no device plugin serves it
(a node moved to the DRA driver keeps its plugin's last annotation, which no longer says anything), and the
scheduler's own checks (resource fit, or DRA's extended-resource allocation) decide. IDs of a deleted pod count
as free only once the node reports them free: until then the kubelet would not hand them out either.
"""

from __future__ import annotations

import logging
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from accel_core.logs import kv
from neuron_dra.extender.placement import MAX_SCORE, NodeState, Placement, place, score
from neuron_dra.extender.podspec import BadInput, PodInfo, device_plugin_away, node_name_and_annotation, pod_info
from neuron_dra.extender.reservations import MAX_NODE_ENTRIES, MAX_PODS, Reservation, ReservationBook
from neuron_dra.usage_annotation import NEURON, NEURONCORE, USAGE_ANNOTATION, DeviceUsage, UsageFormatError, parse_usage

log = logging.getLogger(__name__)

TERMINAL = ("Succeeded", "Failed")
PARSE_CACHE = 4096
PLACEMENT_CACHE = 16384


@dataclass(frozen=True)
class Verdict:
    """One node's answer for one pod."""

    node: str
    fits: bool
    score: int
    reason: str
    detail: str = ""
    placement: Placement | None = None
    added: tuple[str, ...] = ()  # pods counted on top of the annotation
    away: bool = False  # no device plugin serves the node (its allocatable offers neither resource)


class Decider:
    """Filter/prioritize over a pod index (bound pods) and recent reservations; see the module docstring."""

    def __init__(self, *, reserve_for: float = 15.0, max_reservations: int = MAX_PODS,
                 max_reserved_nodes: int = MAX_NODE_ENTRIES, max_reservations_per_namespace: int | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.reserve_for = reserve_for
        #: node -> uid -> bound pod with Neuron requests. Inner dicts are replaced, never changed in place, so a
        #: worker thread may read them while the event loop updates the index.
        self.bound: dict[str, dict[str, PodInfo]] = {}
        self._where: dict[str, str] = {}
        self.reservations = ReservationBook(reserve_for, max_pods=max_reservations,
                                            max_node_entries=max_reserved_nodes,
                                            max_per_namespace=max_reservations_per_namespace, clock=clock)
        self._parsed: OrderedDict[str, DeviceUsage | str] = OrderedDict()
        self._placed: OrderedDict[tuple[object, ...], tuple[Placement, int]] = OrderedDict()

    # -- the pod index (fed by the pod watch) --------------------------------------------------------------------
    def pod_seen(self, pod: PodInfo) -> None:
        self.pod_gone(pod.uid)
        if pod.node and pod.phase not in TERMINAL and pod.requests:
            self.bound[pod.node] = {**self.bound.get(pod.node, {}), pod.uid: pod}
            self._where[pod.uid] = pod.node
        if pod.node:
            self.reservations.drop(pod.uid)

    def pod_gone(self, uid: str) -> None:
        node = self._where.pop(uid, None)
        if node is not None:
            rest = {u: p for u, p in self.bound.get(node, {}).items() if u != uid}
            if rest:
                self.bound[node] = rest
            else:
                self.bound.pop(node, None)

    def reset_index(self) -> None:
        self.bound, self._where = {}, {}

    def reserve(self, pod: PodInfo, nodes: Iterable[str]) -> int:
        """Count ``pod`` on ``nodes`` until it is bound or expires; returns how many of its namespace's reservations
        made room (a refusal, the book being full, counts in ``reservations.refused``)."""
        if pod.uid and pod.requests and pod.uid not in self._where:  # a pod without Neuron requests takes nothing
            return self.reservations.add(pod, nodes)
        return 0

    def live_reservations(self) -> list[Reservation]:
        return self.reservations.live()

    # -- annotations -----------------------------------------------------------------------------------------------
    def usage(self, node: str, value: str | None) -> DeviceUsage | str:
        """The parsed annotation, or a string saying why there is none (parses are cached by value)."""
        if value is None:
            return f"node {node} publishes no {USAGE_ANNOTATION} annotation (device plugin not publishing yet)"
        hit = self._parsed.get(value)
        if hit is None:
            try:
                hit = parse_usage(value, f"node {node} annotation {USAGE_ANNOTATION}")
            except UsageFormatError as exc:
                hit = str(exc)
            self._parsed[value] = hit
            if len(self._parsed) > PARSE_CACHE:
                self._parsed.popitem(last=False)
        return hit

    # -- decisions --------------------------------------------------------------------------------------------------
    def verdict(self, pod: PodInfo, node: str, annotation: str | None, reserved: Sequence[PodInfo] = (),
                *, away: bool = False) -> Verdict:
        """``pod`` on ``node``, counting bound pods the annotation lacks and ``reserved`` (pods reserved there);
        ``away``: no device plugin serves the node (see the module docstring)."""
        if away:
            return Verdict(node, True, 0, "", f"node {node} offers neither {NEURON} nor {NEURONCORE} through a "
                           "device plugin (DRA-served, or the plugin is away): the scheduler's own checks decide",
                           away=True)
        usage = self.usage(node, annotation)
        if isinstance(usage, str):
            return Verdict(node, True, 0, "", usage)
        state = NodeState.from_usage(usage)
        here = self.bound.get(node, {})
        extras = [p for p in here.values() if p.uid != pod.uid and p.key not in usage.pods]
        extras += [p for p in reserved if p.uid != pod.uid]
        added = []
        for other in sorted(extras, key=lambda p: (p.created, p.key)):
            res = place(state, other.requests)
            if res.ok:
                state = res.state
                added.append(other.key)
        result, points = self._place(state, pod)
        if not result.ok:
            return Verdict(node, False, 0, result.reason, result.detail, result, tuple(added))
        return Verdict(node, True, points, "", "", result, tuple(added))

    def _place(self, state: NodeState, pod: PodInfo) -> tuple[Placement, int]:
        """Placement and score, cached by node state and request (many nodes are in the same state)."""
        top = state.topology
        key = (top.kind, top.device_count, state.cores_per_device, state.used_devices, state.used_cores,
               state.unhealthy, pod.requests)
        hit = self._placed.get(key)
        if hit is None:
            result = place(state, pod.requests)
            hit = (result, score(state, result.state) if result.ok else 0)
            self._placed[key] = hit
            if len(self._placed) > PLACEMENT_CACHE:
                self._placed.popitem(last=False)
        return hit

    def decide(self, args: Any, reservations: Sequence[Reservation]) -> tuple[PodInfo, list[tuple[Any, Verdict]]]:
        """Parse ExtenderArgs and judge every node it lists (BadInput on a malformed body)."""
        if not isinstance(args, dict):
            raise BadInput("the body must be a JSON object (ExtenderArgs)")
        lowered = {str(k).lower(): v for k, v in args.items()}
        pod = pod_info(lowered.get("pod"))
        nodes = lowered.get("nodes")
        if nodes is None:
            raise BadInput("ExtenderArgs has no 'nodes': configure the extender with nodeCacheCapable: false")
        if not isinstance(nodes, dict) or not isinstance(nodes.get("items") or [], list):
            raise BadInput("'nodes' must be a NodeList object with an 'items' list")
        listed = [(raw, *node_name_and_annotation(raw, i, USAGE_ANNOTATION))
                  for i, raw in enumerate(nodes.get("items") or [])]
        reserved = reserved_by_node(reservations, {name for _, name, _ in listed}, pod.uid)
        return pod, [(raw, self.verdict(pod, name, value, reserved.get(name, ()),
                                        away=device_plugin_away(raw)))
                     for raw, name, value in listed]

    def filter(self, args: Any, reservations: Sequence[Reservation]) -> tuple[PodInfo, dict[str, Any],
                                                                              list[Verdict]]:
        """ExtenderFilterResult for ``args`` (passed nodes, failed nodes with reasons) and the verdicts."""
        pod, judged = self.decide(args, reservations)
        passed = [raw for raw, v in judged if v.fits]
        failed = {v.node: v.reason for _, v in judged if not v.fits}
        for _, v in judged:
            if v.detail:
                log.debug("node verdict", extra=kv(pod=pod.key, node=v.node, fits=v.fits, detail=v.detail))
        return pod, {"nodes": {"apiVersion": "v1", "kind": "NodeList", "items": passed}, "failedNodes": failed,
                     "error": ""}, [v for _, v in judged]

    def prioritize(self, args: Any, reservations: Sequence[Reservation]) -> tuple[list[dict[str, Any]],
                                                                                  list[Verdict]]:
        """HostPriorityList: 0..10 per node, higher = the placement keeps more connected capacity."""
        _, judged = self.decide(args, reservations)
        return [{"host": v.node, "score": v.score if v.fits else 0} for _, v in judged], [v for _, v in judged]


def reserved_by_node(reservations: Sequence[Reservation], nodes: set[str], uid: str) -> dict[str, list[PodInfo]]:
    """Pods reserved on each of ``nodes`` other than ``uid`` (work: the reservations' entries on these nodes)."""
    out: dict[str, list[PodInfo]] = {}
    for r in reservations:
        if r.pod.uid != uid:
            for name in r.nodes.intersection(nodes):
                out.setdefault(name, []).append(r.pod)
    return out


def explain(pod: PodInfo, node: str, verdict: Verdict) -> str:
    """A few lines for people: does ``pod`` fit ``node``, with which IDs, or why not."""
    lines = [f"pod {pod.key} on node {node}: {'fits' if verdict.fits else 'does not fit'}"]
    if not pod.requests:
        lines.append("  the pod requests no aws.amazon.com/neuron or aws.amazon.com/neuroncore")
    if verdict.added:
        lines.append(f"  counted on top of the node's annotation (not reported by the node yet): "
                     f"{', '.join(verdict.added)}")
    if verdict.placement is not None:
        for req, ids in verdict.placement.ids:
            lines.append(f"  container {req.container}: {req.count} x {req.resource} -> {list(ids)}")
    if verdict.reason:
        lines.append(f"  reason: {verdict.reason}")
    if verdict.detail:
        lines.append(f"  detail: {verdict.detail}")
    if verdict.fits and verdict.placement is not None:
        lines.append(f"  score: {verdict.score}/{MAX_SCORE} (share of connected capacity the placement keeps)")
    return "\n".join(lines)
