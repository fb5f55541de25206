"""Why a claim is pending: the scheduler's device allocation replayed node by node, with reasons.

:func:`explain` takes the claims to place (a pod's, or one claim or template), the DeviceClasses, the
ResourceSlices and the other claims' allocations, all as the API server's JSON, and says per node whether a set of
devices fits and, if not, why: which selector rejects which devices, how many matching devices are free against
how many are asked for, which constraint no free set satisfies (with the values the devices have), and what the
devices are held by (other claims, taints, exhausted shared counters). Selectors are CEL, evaluated by
:mod:`accel_core.dra.explain_cel`. The search is the allocator's: requests in order, the alternatives of a
``firstAvailable`` request in order, devices in pool and slice order, backtracking. It is generic: a driver adds
only :class:`ExplainHints` (a line per constraint attribute, such as which connected-set sizes exist).

Checked against kube-scheduler 1.37 by ``tests/e2e/test_dra_explain_e2e.py``. Not modelled: consumable capacity
(``allowMultipleAllocations`` devices shared between claims), binding conditions, per-device node selection by
labels, and slices whose pool targets nodes by a node selector (each is named in the output when met).
"""

from __future__ import annotations

import re
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

import msgspec

from accel_core.dra.explain_cel import (
    CelRuntimeError,
    CelUnsupported,
    Selector,
    compile_selector,
    device_context,
    device_variable,
)
from accel_core.dra.explain_cel import parse_quantity as _quantity

#: Steps of the device search per node before explain gives up on that node (the scheduler has a time limit too).
SEARCH_LIMIT = 200_000

DeviceId = tuple[str, str, str]  # driver, pool, device


@dataclass(frozen=True)
class ExplainHints:
    """What a driver adds to the generic reasons."""

    attribute_notes: Mapping[str, str] = field(default_factory=dict)
    """Fully qualified attribute -> one line shown when a constraint on it fails (e.g. the connected sizes)."""


@dataclass
class Device:
    driver: str
    pool: str
    name: str
    raw: Mapping[str, Any]
    _attributes: dict[str, Any] = field(default_factory=dict)
    _uses: dict[tuple[str, str], Fraction] | None = None

    @property
    def id(self) -> DeviceId:
        return (self.driver, self.pool, self.name)

    def attribute(self, qualified: str) -> Any:
        """The value of a fully qualified attribute (an unqualified one is in the driver's domain), or None."""
        if qualified not in self._attributes:
            attrs = self.raw.get("attributes") or {}
            domain, _, ident = qualified.partition("/")
            value = attrs.get(qualified, attrs.get(ident) if domain == self.driver else None)
            self._attributes[qualified] = None if value is None else next(
                (v if not isinstance(v, list) else tuple(v)) for v in value.values())
        return self._attributes[qualified]

    def content(self) -> bytes:
        """What a selector can see of it (driver, attributes, capacity): devices alike in these match alike."""
        return msgspec.json.encode([self.driver, self.raw.get("attributes"), self.raw.get("capacity"),
                                    self.raw.get("allowMultipleAllocations")], order="sorted")

    def uses(self) -> dict[tuple[str, str], Fraction]:
        """The shared counters it consumes: (counter set, counter) -> amount."""
        if self._uses is None:
            self._uses = defaultdict(Fraction)
            for use in self.raw.get("consumesCounters") or []:
                for counter, value in (use.get("counters") or {}).items():
                    self._uses[(use["counterSet"], counter)] += _quantity(str(value.get("value", "0")))
        return self._uses


@dataclass
class Pool:
    driver: str
    name: str
    node: str | None  #: None: every node (allNodes)
    devices: list[Device] = field(default_factory=list)
    counters: dict[tuple[str, str], Fraction] = field(default_factory=dict)
    complete: bool = True
    note: str = ""


def inventory(slices: Iterable[Mapping[str, Any]]) -> list[Pool]:
    """Pools from ResourceSlices: the newest generation of each, complete when all its slices are there."""
    by_pool: dict[tuple[str, str], list[Mapping[str, Any]]] = defaultdict(list)
    for s in slices:
        spec = s.get("spec") or {}
        by_pool[(spec.get("driver", ""), (spec.get("pool") or {}).get("name", ""))].append(spec)
    pools = []
    for (driver, name), specs in sorted(by_pool.items()):
        newest = max(int((s.get("pool") or {}).get("generation", 0)) for s in specs)
        specs = [s for s in specs if int((s.get("pool") or {}).get("generation", 0)) == newest]
        first = specs[0]
        pool = Pool(driver, name, first.get("nodeName"))
        expected = int((first.get("pool") or {}).get("resourceSliceCount", 1))
        pool.complete = len(specs) == expected
        if not pool.complete:
            pool.note = f"pool {name} of {driver} is being updated ({len(specs)} of {expected} slices): the " \
                        "scheduler uses none of its devices until it is complete"
        if first.get("nodeSelector") is not None or first.get("perDeviceNodeSelection"):
            pool.note = f"pool {name} of {driver} selects its nodes by labels or per device: not evaluated by explain"
            pool.complete = False
        for spec in specs:
            for counter_set in spec.get("sharedCounters") or []:
                for counter, value in (counter_set.get("counters") or {}).items():
                    pool.counters[(counter_set["name"], counter)] = _quantity(str(value.get("value", "0")))
            for raw in spec.get("devices") or []:
                pool.devices.append(Device(driver, name, raw["name"], raw))
        pools.append(pool)
    return pools


# -- what is asked ---------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Alternative:
    name: str  #: ``req`` or ``req/sub``
    class_name: str
    selectors: tuple[str, ...]
    all_devices: bool
    count: int
    tolerations: tuple[Mapping[str, Any], ...]
    admin: bool
    capacity: bool = False  #: asks for capacity (consumable capacity; not modelled)


@dataclass(frozen=True)
class Request:
    claim: int
    name: str
    alternatives: tuple[Alternative, ...]


@dataclass(frozen=True)
class Constraint:
    claim: int
    requests: tuple[str, ...]  #: empty: every request of the claim
    kind: str  #: matchAttribute or distinctAttribute
    attribute: str

    def covers(self, claim: int, request: str, alt: str) -> bool:
        return claim == self.claim and (not self.requests or request in self.requests or alt in self.requests)

    def describe(self) -> str:
        scope = f" (requests {', '.join(self.requests)})" if self.requests else ""
        return f"constraint {self.kind} {self.attribute}{scope}"


@dataclass(frozen=True)
class ClaimSpec:
    """One claim to place: its label for the output and its ``spec`` (a ResourceClaimSpec)."""

    label: str
    spec: Mapping[str, Any]


def _alternative(name: str, body: Mapping[str, Any]) -> Alternative:
    mode = body.get("allocationMode") or "ExactCount"
    return Alternative(name=name, class_name=body.get("deviceClassName", ""),
                       selectors=tuple(s["cel"]["expression"] for s in body.get("selectors") or [] if "cel" in s),
                       all_devices=mode == "All", count=int(body.get("count") or 1),
                       tolerations=tuple(body.get("tolerations") or ()), admin=bool(body.get("adminAccess")),
                       capacity=bool(body.get("capacity")))


def requests_of(claims: Sequence[ClaimSpec]) -> tuple[list[Request], list[Constraint]]:
    requests, constraints = [], []
    for i, claim in enumerate(claims):
        devices = claim.spec.get("devices") or {}
        for req in devices.get("requests") or []:
            if req.get("firstAvailable"):
                alts = tuple(_alternative(f"{req['name']}/{sub['name']}", sub) for sub in req["firstAvailable"])
            else:
                alts = (_alternative(req["name"], req.get("exactly") or req),)
            requests.append(Request(i, req["name"], alts))
        for c in devices.get("constraints") or []:
            for kind in ("matchAttribute", "distinctAttribute"):
                if c.get(kind):
                    constraints.append(Constraint(i, tuple(c.get("requests") or ()), kind, c[kind]))
    return requests, constraints


# -- node by node ------------------------------------------------------------------------------------------------------
@dataclass
class Filtered:
    """One alternative of a request on one node: what matches, what is free, and why the rest is not."""

    matching: list[Device] = field(default_factory=list)
    free: list[Device] = field(default_factory=list)
    rejected: dict[str, list[str]] = field(default_factory=lambda: defaultdict(list))
    unusable: dict[str, list[str]] = field(default_factory=lambda: defaultdict(list))
    error: str = ""
    total: int = 0
    in_class: int = 0  #: devices its DeviceClass selects


@dataclass
class NodeVerdict:
    node: str
    fits: bool | None  #: None: explain cannot tell (a selector it cannot evaluate, a CEL error, the search limit)
    chosen: list[tuple[str, str, DeviceId]] = field(default_factory=list)  #: claim label, request, device
    reasons: list[str] = field(default_factory=list)


def _tolerated(taint: Mapping[str, Any], tolerations: Sequence[Mapping[str, Any]]) -> bool:
    for t in tolerations:
        if t.get("key") and t["key"] != taint.get("key"):
            continue
        if t.get("effect") and t["effect"] != taint.get("effect"):
            continue
        if (t.get("operator") or "Equal") == "Exists" or t.get("value", "") == taint.get("value", ""):
            return True
    return False


class Explainer:
    def __init__(self, claims: Sequence[ClaimSpec], classes: Mapping[str, Mapping[str, Any]],
                 slices: Iterable[Mapping[str, Any]], allocated: Mapping[DeviceId, str],
                 hints: ExplainHints | None = None) -> None:
        self.claims = list(claims)
        self.classes = classes
        self.pools = inventory(slices)
        self.allocated = allocated  #: device -> the claim holding it
        self.hints = hints or ExplainHints()
        self.requests, self.constraints = requests_of(self.claims)
        self._pools = {(p.driver, p.name): p for p in self.pools}
        self._node_pools: dict[str | None, list[Pool]] = defaultdict(list)
        for p in self.pools:
            self._node_pools[p.node].append(p)
        self._selectors: dict[str, Selector | str] = {}
        self._content: dict[DeviceId, bytes] = {}
        self._match: dict[tuple[bytes, str], bool | str] = {}  #: (device content, expression) -> verdict
        self._contexts: dict[bytes, Any] = {}
        expressions = [e for r in self.requests for a in r.alternatives for e in a.selectors]
        expressions += [s["cel"]["expression"] for r in self.requests for a in r.alternatives
                        for s in (self.classes.get(a.class_name, {}).get("spec") or {}).get("selectors") or []
                        if "cel" in s]
        self._domains = tuple(dict.fromkeys(d for e in expressions if isinstance(c := self._selector(e), Selector)
                                            for d in c.literals))
        self.used_counters: dict[tuple[str, str, str, str], Fraction] = defaultdict(Fraction)
        by_id = {d.id: d for p in self.pools for d in p.devices}
        for dev_id in allocated:
            if dev_id in by_id:
                for key, value in by_id[dev_id].uses().items():
                    self.used_counters[(dev_id[0], dev_id[1], *key)] += value

    def nodes(self) -> list[str]:
        return sorted({p.node for p in self.pools if p.node})

    def notes(self) -> list[str]:
        """What explain does not model but met here (the verdicts may then differ from the scheduler's)."""
        out = [p.note for p in self.pools if p.note]
        shared = [d.name for p in self.pools for d in p.devices if d.raw.get("allowMultipleAllocations")]
        if shared:
            out.append(f"{len(shared)} device(s) allow multiple allocations (consumable capacity), taken here as "
                       f"held by one claim: {compact(shared)}")
        if any(a.capacity for r in self.requests for a in r.alternatives):
            out.append("a request asks for device capacity (consumable capacity): not checked by explain")
        return out

    # -- selectors ---------------------------------------------------------------------------------------------------
    def _selector(self, expression: str) -> Selector | str:
        if expression not in self._selectors:
            try:
                self._selectors[expression] = compile_selector(expression)
            except CelUnsupported as exc:
                self._selectors[expression] = str(exc)
        return self._selectors[expression]

    def _passes(self, device: Device, expression: str) -> bool | str:
        """True/False, or the error text (unsupported or a runtime error)."""
        content = self._content.get(device.id)
        if content is None:
            content = self._content[device.id] = device.content()
        key = (content, expression)
        if key not in self._match:
            selector = self._selector(expression)
            if isinstance(selector, str):
                self._match[key] = f"unsupported: {selector}"
            else:
                if content not in self._contexts:
                    self._contexts[content] = device_context(device_variable(device.driver, device.raw),
                                                             self._domains)
                try:
                    self._match[key] = selector.matches({}, self._contexts[content])
                except CelRuntimeError as exc:
                    self._match[key] = f"CEL runtime error: {exc}"
        verdict = self._match[key]
        if isinstance(verdict, str) and verdict.startswith("CEL runtime error: "):
            return verdict.replace("CEL runtime error: ", f"CEL runtime error on device {device.name}: ", 1)
        return verdict

    # -- one alternative on one node ---------------------------------------------------------------------------------
    def filter(self, node: str, alt: Alternative) -> Filtered:
        out = Filtered()
        cls = self.classes.get(alt.class_name)
        if cls is None:
            out.error = f"DeviceClass {alt.class_name} does not exist"
            return out
        selectors = [(f"selector #{i} of class {alt.class_name}", s["cel"]["expression"])
                     for i, s in enumerate((cls.get("spec") or {}).get("selectors") or []) if "cel" in s]
        selectors += [(f"selector #{i} of the request", e) for i, e in enumerate(alt.selectors)]
        pools = [p for p in self._node_pools[node] + self._node_pools[None] if p.complete]
        if alt.all_devices and any(not p.complete for p in self._node_pools[node]):
            out.error = "asks for all devices, but a pool of the node is being updated"
        for pool in pools:
            for device in pool.devices:
                out.total += 1
                verdict: bool | str = True
                for n, (label, expression) in enumerate(selectors):
                    if n == len(selectors) - len(alt.selectors):
                        out.in_class += 1
                    verdict = self._passes(device, expression)
                    if verdict is not True:
                        if verdict is False:
                            out.rejected[f"{label} `{expression}`"].append(device.name)
                        elif not out.error:
                            out.error = f"{label}: {verdict}"
                        break
                if verdict is not True:
                    continue
                if not alt.selectors:
                    out.in_class += 1
                out.matching.append(device)
                why = self._unusable(device, alt)
                if why:
                    out.unusable[why].append(device.name)
                else:
                    out.free.append(device)
        return out

    def _unusable(self, device: Device, alt: Alternative) -> str:
        holder = self.allocated.get(device.id)
        if holder and not alt.admin:
            return f"held by claim {holder}"
        for taint in device.raw.get("taints") or []:
            if taint.get("effect") in ("NoSchedule", "NoExecute") and not _tolerated(taint, alt.tolerations):
                return f"tainted {taint.get('key')}={taint.get('value', '')}:{taint.get('effect')}"
        if device.raw.get("bindingConditions"):
            return "has binding conditions (not modelled by explain)"
        pool = self._pools[(device.driver, device.pool)]
        for (counter_set, counter), value in device.uses().items():
            left = pool.counters.get((counter_set, counter), Fraction(0)) - \
                self.used_counters[(device.driver, device.pool, counter_set, counter)]
            if value > left:
                return f"shared counter {counter_set}/{counter} used up by allocated devices"
        return ""

    # -- the search ------------------------------------------------------------------------------------------------
    def explain_node(self, node: str) -> NodeVerdict:
        verdict = NodeVerdict(node, False)
        filtered = {(r.claim, a.name): self.filter(node, a) for r in self.requests for a in r.alternatives}
        errors = sorted({f.error for f in filtered.values() if f.error})
        if errors:
            verdict.fits = None if any(e.split(": ", 1)[-1].startswith(("unsupported", "CEL runtime"))
                                       for e in errors) else False
            verdict.reasons = errors
            return verdict
        search = _Search(self, filtered)
        try:
            found = not self._hopeless(filtered) and search.run()
        except _LimitReached:
            verdict.fits = None
            verdict.reasons = [f"explain gave up after {SEARCH_LIMIT} steps of the device search"]
            return verdict
        if found:
            verdict.fits = True
            verdict.chosen = [(self.claims[c].label, alt, dev.id) for c, alt, dev in search.chosen]
            return verdict
        verdict.reasons = self._why_not(filtered)
        return verdict

    def _hopeless(self, filtered: Mapping[tuple[int, str], Filtered]) -> bool:
        """A matchAttribute constraint on one single-choice request whose largest group of free devices sharing
        a value is smaller than the count: no search can succeed (it would try every first device)."""
        for c in self.constraints:
            if c.kind != "matchAttribute":
                continue
            covered = [r for r in self.requests if any(c.covers(r.claim, r.name, a.name) for a in r.alternatives)]
            if len(covered) != 1 or len(covered[0].alternatives) != 1 or covered[0].alternatives[0].all_devices:
                continue
            alt = covered[0].alternatives[0]
            groups = Counter(d.attribute(c.attribute) for d in filtered[(covered[0].claim, alt.name)].free)
            groups.pop(None, None)
            if max(groups.values(), default=0) < alt.count:
                return True
        return False

    def _why_not(self, filtered: Mapping[tuple[int, str], Filtered]) -> list[str]:
        reasons = []
        short = False
        for r in self.requests:
            for alt in r.alternatives:
                f = filtered[(r.claim, alt.name)]
                need = len(f.matching) if alt.all_devices else alt.count
                prefix = f"{self._claim_prefix(r.claim)}request {alt.name}"
                if alt.all_devices and f.unusable:
                    reasons.append(f"{prefix}: asks for all {len(f.matching)} matching devices, but "
                                   + "; ".join(f"{len(v)} {k} ({compact(v)})" for k, v in sorted(f.unusable.items())))
                    short = True
                elif alt.all_devices and not f.matching:
                    reasons.append(f"{prefix}: asks for all matching devices, and no device matches"
                                   + (self._rejections(f) if f.in_class else f" (no device of class {alt.class_name})"
                                      + self._rejections(f)))
                    short = True
                elif len(f.free) < need:
                    short = True
                    if not f.total:
                        reasons.append(f"{prefix}: no devices published for this node")
                    elif not f.in_class:
                        reasons.append(f"{prefix}: no device of class {alt.class_name} on the node"
                                       + self._rejections(f))
                    elif not f.matching:
                        reasons.append(f"{prefix}: no device matches" + self._rejections(f))
                    elif len(f.matching) < need:
                        reasons.append(f"{prefix}: asks for {need} devices, only {len(f.matching)} of the node's "
                                       f"{f.in_class} devices of class {alt.class_name} match" + self._rejections(f))
                    else:
                        reasons.append(f"{prefix}: asks for {need} devices, only {len(f.free)} of {len(f.matching)} "
                                       "matching devices are free: " + "; ".join(
                                           f"{len(v)} {k} ({compact(v)})" for k, v in sorted(f.unusable.items())))
                else:
                    reasons.append(f"{prefix}: {len(f.free)} free matching devices for {need}")
        if not short:
            alts = [(r, r.alternatives[0]) for r in self.requests if not r.alternatives[0].admin]
            need = sum(len(filtered[(r.claim, a.name)].matching) if a.all_devices else a.count for r, a in alts)
            union = {d.id for r, a in alts for d in filtered[(r.claim, a.name)].free}
            if len(alts) > 1 and all(len(r.alternatives) == 1 for r in self.requests) and len(union) < need:
                reasons.append(f"the requests together ask for {need} devices; {len(union)} distinct free devices "
                               "match them")
                return reasons
            found = False
            for c in self.constraints:
                text = self._constraint_reason(c, filtered)
                if text:
                    reasons.append(text)
                    found = True
            if not found:
                reasons.append("no combination of free devices satisfies all requests and constraints together "
                               "(each request alone could be met)")
        return reasons

    def _claim_prefix(self, claim: int) -> str:
        return f"claim {self.claims[claim].label}: " if len(self.claims) > 1 else ""

    @staticmethod
    def _rejections(f: Filtered) -> str:
        """What the selectors reject: the request's, or the class's when the class selects nothing here."""
        shown = {label: names for label, names in f.rejected.items() if f.in_class == 0 or " of class " not in label}
        if not shown:
            return ""
        return ": " + "; ".join(f"{label} rejects {len(names)} ({compact(names)})" for label, names in shown.items())

    def _constraint_reason(self, c: Constraint, filtered: Mapping[tuple[int, str], Filtered]) -> str:
        covered = [(r, r.alternatives[0]) for r in self.requests if c.covers(r.claim, r.name, r.alternatives[0].name)]
        if not covered:
            return ""
        need = sum(len(filtered[(r.claim, a.name)].matching) if a.all_devices else a.count for r, a in covered)
        free = {d.id: d for r, a in covered for d in filtered[(r.claim, a.name)].free}
        values = Counter(d.attribute(c.attribute) for d in free.values())
        missing = values.pop(None, 0)
        note = self.hints.attribute_notes.get(c.attribute, "")
        lack = f"; {missing} lack the attribute" if missing else ""
        if c.kind == "matchAttribute":
            sizes = sorted(values.values(), reverse=True)
            if sizes and sizes[0] >= need:
                return ""
            text = (f"{c.describe()}: no set of {need} free matching devices shares one value; the node's free "
                    f"devices group by value as {'+'.join(map(str, sizes)) or 'nothing'}{lack}")
        else:
            if len(values) >= need:
                return ""
            text = (f"{c.describe()}: {need} devices with different values are asked for, the node's free matching "
                    f"devices have {len(values)} distinct values{lack}")
        return text + (f". {note}" if note else "")


class _LimitReached(Exception):
    pass


class _Search:
    """Backtracking over requests (alternatives in order) and devices (pool order), as the allocator does."""

    def __init__(self, explainer: Explainer, filtered: Mapping[tuple[int, str], Filtered]) -> None:
        self.e = explainer
        self.filtered = filtered
        self.used: set[DeviceId] = set()
        self.counters: dict[tuple[str, str, str, str], Fraction] = defaultdict(Fraction)
        self.values: list[list[Any]] = [[] for _ in explainer.constraints]
        self.chosen: list[tuple[int, str, Device]] = []
        self.steps = 0

    def run(self) -> bool:
        return self._request(0)

    def _request(self, index: int) -> bool:
        if index == len(self.e.requests):
            return True
        r = self.e.requests[index]
        for alt in r.alternatives:
            f = self.filtered[(r.claim, alt.name)]
            if alt.all_devices:
                if len(f.free) != len(f.matching) or not f.matching:
                    continue
                if self._pick(index, r, alt, f.free, 0, len(f.free), must=True):
                    return True
            elif self._pick(index, r, alt, f.free, 0, alt.count, must=False):
                return True
        return False

    def _pick(self, index: int, r: Request, alt: Alternative, candidates: Sequence[Device], start: int,
              left: int, must: bool) -> bool:
        if left == 0:
            return self._request(index + 1)
        for i in range(start, len(candidates) - left + 1):
            self.steps += 1
            if self.steps > SEARCH_LIMIT:
                raise _LimitReached
            device = candidates[i]
            undo = self._add(r, alt, device)
            if undo is not None:
                if self._pick(index, r, alt, candidates, i + 1, left - 1, must):
                    return True
                undo()
            if must:
                return False
        return False

    def _add(self, r: Request, alt: Alternative, device: Device) -> Any:
        if device.id in self.used and not alt.admin:
            return None
        touched = []
        for ci, c in enumerate(self.e.constraints):
            if not c.covers(r.claim, r.name, alt.name):
                continue
            value = device.attribute(c.attribute)
            if value is None:
                return None
            seen = self.values[ci]
            if c.kind == "matchAttribute" and seen and seen[0] != value:
                return None
            if c.kind == "distinctAttribute" and value in seen:
                return None
            touched.append(ci)
        pool = self.e._pools[(device.driver, device.pool)]
        use = device.uses()
        for (counter_set, counter), value in use.items():
            key = (device.driver, device.pool, counter_set, counter)
            if self.e.used_counters[key] + self.counters[key] + value > pool.counters.get((counter_set, counter), 0):
                return None
        for ci in touched:
            self.values[ci].append(device.attribute(self.e.constraints[ci].attribute))
        for (counter_set, counter), value in use.items():
            self.counters[(device.driver, device.pool, counter_set, counter)] += value
        self.used.add(device.id)
        self.chosen.append((r.claim, alt.name, device))

        def undo() -> None:
            self.chosen.pop()
            self.used.discard(device.id)
            for (counter_set, counter), value in use.items():
                self.counters[(device.driver, device.pool, counter_set, counter)] -= value
            for ci in touched:
                self.values[ci].pop()
        return undo


def compact(names: Sequence[str], limit: int = 6) -> str:
    """``dev-0..3, dev-7``: runs of numbered names folded."""
    groups: dict[str, list[int]] = defaultdict(list)
    plain = []
    for name in names:
        m = re.fullmatch(r"(.*?)(\d+)", name)
        if m:
            groups[m[1]].append(int(m[2]))
        else:
            plain.append(name)
    parts = []
    for prefix, numbers in groups.items():
        numbers.sort()
        start = prev = numbers[0]
        for n in [*numbers[1:], None]:
            if n is not None and n == prev + 1:
                prev = n
                continue
            parts.append(f"{prefix}{start}" + (f"..{prev}" if prev > start else ""))
            if n is not None:
                start = prev = n
    parts += plain
    return ", ".join(parts[:limit]) + (f", ... ({len(parts) - limit} more)" if len(parts) > limit else "")
