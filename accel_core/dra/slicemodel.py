"""The ResourceSlice vocabulary a DRA profile speaks (resource.k8s.io/v1): devices with their attributes, capacity,
taints and consumed counters, the counter sets a pool shares, quantities, and the limits the API server enforces.

Limits are checked locally before anything is sent (:func:`validate_devices`); errors name the device. Names are
checked with :mod:`accel_core.k8snames`.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from decimal import Decimal

from lightkube.models import resource_v1 as api
from lightkube.utils.quantity import parse_quantity

from accel_core.k8snames import is_c_identifier, is_label, is_name_part, is_subdomain

MAX_ATTRIBUTES_AND_CAPACITIES = 32
MAX_ATTRIBUTE_STRING = 64
MAX_TAINTS_PER_DEVICE = 4
MAX_COUNTERS_PER_SET = 32
MAX_COUNTER_CONSUMPTIONS_PER_DEVICE = 2
TAINT_EFFECTS = ("NoSchedule", "NoExecute", "None")
INT64_MAX = 2**63 - 1

_SEMVER = re.compile(
    r"(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)"
    r"(?:-((?:0|[1-9][0-9]*|[0-9]*[a-zA-Z-][0-9a-zA-Z-]*)(?:\.(?:0|[1-9][0-9]*|[0-9]*[a-zA-Z-][0-9a-zA-Z-]*))*))?"
    r"(?:\+([0-9a-zA-Z-]+(?:\.[0-9a-zA-Z-]+)*))?", re.ASCII)
_BINARY_SUFFIXES = ("Ei", "Pi", "Ti", "Gi", "Mi", "Ki")


class SliceValidationError(ValueError):
    """A device would break a resource.k8s.io/v1 limit; the message names the device and the field."""


@dataclass(frozen=True)
class Version:
    """A ``version`` attribute (semantic version 2.0.0)."""

    value: str


AttributeValue = bool | int | str | Version


@dataclass(frozen=True)
class Taint:
    """A device taint; ``effect`` is NoSchedule, NoExecute or None. ``time_added`` (timezone-aware) is sent as
    ``timeAdded`` when set; when not, the API server stamps the time of every write that carries the taint."""

    key: str
    value: str = ""
    effect: str = "NoSchedule"
    time_added: datetime | None = None


@dataclass(frozen=True)
class CounterSet:
    """Counters that devices of the pool share (partitionable devices): a device is allocatable only while what it
    consumes is left, so two devices that consume the same counter in full exclude each other."""

    name: str
    counters: Mapping[str, int]

    def to_api(self) -> api.CounterSet:
        return api.CounterSet(name=self.name, counters=_counters(self.counters))


@dataclass(frozen=True)
class SliceDevice:
    """One device as the driver wants it published. Capacity values are ints or Kubernetes quantity strings."""

    name: str
    attributes: Mapping[str, AttributeValue] = field(default_factory=dict)
    capacity: Mapping[str, int | str] = field(default_factory=dict)
    taints: tuple[Taint, ...] = ()
    consumes: Mapping[str, Mapping[str, int]] = field(default_factory=dict)
    """Shared counters this device uses up while allocated: counter set -> counter -> amount."""
    node_label_gate: str | None = None
    """Published only while the driver's Node gives this node-label attribute the value ``true``
    (:func:`accel_core.dra.nodelabels.with_attributes`); None: always. Not part of the API object."""
    consumes_gates: Mapping[str, str] = field(default_factory=dict)
    """Counter set -> node-label attribute: that set's entry of ``consumes`` is published only while the attribute
    is ``true`` (the same way); sets not named here always are."""

    def to_api(self) -> api.Device:
        return api.Device(
            name=self.name,
            attributes={k: _attribute(v) for k, v in sorted(self.attributes.items())} or None,
            capacity={k: api.DeviceCapacity(value=quantity(v)) for k, v in sorted(self.capacity.items())} or None,
            consumesCounters=[api.DeviceCounterConsumption(counterSet=cs, counters=_counters(used))
                              for cs, used in sorted(self.consumes.items())] or None,
            taints=[api.DeviceTaint(key=t.key, value=t.value or None, effect=t.effect, timeAdded=t.time_added)
                    for t in self.taints] or None)


def _attribute(value: AttributeValue) -> api.DeviceAttribute:
    if isinstance(value, bool):
        return api.DeviceAttribute(bool=value)
    if isinstance(value, int):
        return api.DeviceAttribute(int=value)
    if isinstance(value, Version):
        return api.DeviceAttribute(version=value.value)
    return api.DeviceAttribute(string=value)


def _counters(counters: Mapping[str, int]) -> dict[str, api.Counter]:
    return {c: api.Counter(value=quantity(v)) for c, v in sorted(counters.items())}


def quantity(value: int | str) -> str:
    """A quantity string; ints that are exact multiples of 1024 use the binary suffix (``96Gi``)."""
    if isinstance(value, str):
        return value
    for i, suffix in enumerate(_BINARY_SUFFIXES):
        unit = 1024 ** (len(_BINARY_SUFFIXES) - i)
        if value and value % unit == 0:
            return f"{value // unit}{suffix}"
    return str(value)


def quantity_value(text: str) -> Decimal:
    """The numeric value of a Kubernetes quantity string (lightkube's parser, ASCII only: ``Decimal`` also reads
    other scripts' digits); raises ValueError for malformed ones."""
    if not text.isascii():
        raise ValueError(f"not a quantity: {text[:40]!r}")
    value = parse_quantity(text)
    if value is None:
        raise ValueError("not a quantity: None")
    return value


# -- validation ------------------------------------------------------------------------------------------------
def _check_qualified_name(device: str, what: str, name: str) -> None:
    domain, _, ident = name.rpartition("/")
    if not is_c_identifier(ident):
        raise SliceValidationError(
            f"device {device}: {what} name {name!r}: {ident!r} must be a C identifier of at most 32 characters")
    if "/" in name and not is_subdomain(domain, most=63):
        raise SliceValidationError(
            f"device {device}: {what} name {name!r}: domain {domain!r} must be a DNS subdomain of at most 63 "
            "characters")


def _check_attribute(device: str, name: str, value: AttributeValue) -> None:
    _check_qualified_name(device, "attribute", name)
    if isinstance(value, bool):
        return
    if isinstance(value, int):
        if not -INT64_MAX - 1 <= value <= INT64_MAX:
            raise SliceValidationError(f"device {device}: attribute {name!r}: {value} does not fit in int64")
        return
    text = value.value if isinstance(value, Version) else value
    if not isinstance(text, str):
        raise SliceValidationError(f"device {device}: attribute {name!r}: unsupported type {type(value).__name__}")
    if len(text) > MAX_ATTRIBUTE_STRING:
        raise SliceValidationError(f"device {device}: attribute {name!r}: value of {len(text)} characters exceeds "
                                   f"{MAX_ATTRIBUTE_STRING}")
    if isinstance(value, Version) and not _SEMVER.fullmatch(text):
        raise SliceValidationError(f"device {device}: attribute {name!r}: {text!r} is not a semantic version")


def _check_taint(device: str, taint: Taint) -> None:
    prefix, _, name = taint.key.rpartition("/")
    if not is_name_part(name) or ("/" in taint.key and not is_subdomain(prefix)):
        raise SliceValidationError(f"device {device}: taint key {taint.key!r} is not a qualified name")
    if taint.value and not is_name_part(taint.value):
        raise SliceValidationError(f"device {device}: taint {taint.key!r}: value {taint.value!r} is not a label "
                                   "value (at most 63 characters)")
    if taint.effect not in TAINT_EFFECTS:
        raise SliceValidationError(f"device {device}: taint {taint.key!r}: effect {taint.effect!r} is not one of "
                                   f"{', '.join(TAINT_EFFECTS)}")


def validate_device(device: SliceDevice) -> None:
    """Raise SliceValidationError if ``device`` breaks a resource.k8s.io/v1 limit."""
    name = device.name
    if not is_label(name):
        raise SliceValidationError(f"device {name!r}: name must be a DNS label of at most 63 characters")
    total = len(device.attributes) + len(device.capacity)
    if total > MAX_ATTRIBUTES_AND_CAPACITIES:
        raise SliceValidationError(f"device {name}: {len(device.attributes)} attributes + {len(device.capacity)} "
                                   f"capacities = {total}, more than {MAX_ATTRIBUTES_AND_CAPACITIES}")
    for attr, value in device.attributes.items():
        _check_attribute(name, attr, value)
    for cap, amount in device.capacity.items():
        _check_qualified_name(name, "capacity", cap)
        try:
            ok = quantity_value(quantity(amount)) >= 0
        except ValueError:
            ok = False
        if not ok:
            raise SliceValidationError(f"device {name}: capacity {cap!r}: {amount!r} is not a non-negative quantity")
    if len(device.taints) > MAX_TAINTS_PER_DEVICE:
        raise SliceValidationError(f"device {name}: {len(device.taints)} taints, more than {MAX_TAINTS_PER_DEVICE}")
    for taint in device.taints:
        _check_taint(name, taint)


def validate_devices(devices: Sequence[SliceDevice], counters: Sequence[CounterSet] = ()) -> None:
    """Validate every device, that names are unique within the pool, the counter sets (DNS-label names, unique,
    1 to 32 counters), and that a device consumes from at most 2 sets, and only counters that exist."""
    known: dict[str, Mapping[str, int]] = {}
    for cset in counters:
        bad = [n for n in (cset.name, *cset.counters) if not is_label(n)]
        if bad or cset.name in known or not 0 < len(cset.counters) <= MAX_COUNTERS_PER_SET:
            why = (f"{bad[0]!r} is not a DNS label" if bad else "name used twice in the pool" if cset.name in known
                   else f"{len(cset.counters)} counters, not 1 to {MAX_COUNTERS_PER_SET}")
            raise SliceValidationError(f"counter set {cset.name!r}: {why}")
        known[cset.name] = cset.counters
    seen: set[str] = set()
    for device in devices:
        validate_device(device)
        if device.name in seen:
            raise SliceValidationError(f"device {device.name}: name used twice in the pool")
        seen.add(device.name)
        if len(device.consumes) > MAX_COUNTER_CONSUMPTIONS_PER_DEVICE:
            raise SliceValidationError(f"device {device.name}: consumes from {len(device.consumes)} counter sets, "
                                       f"more than {MAX_COUNTER_CONSUMPTIONS_PER_DEVICE}")
        for cs, used in device.consumes.items():
            missing = [c for c in used if c not in known.get(cs, {})]
            if cs not in known:
                raise SliceValidationError(f"device {device.name}: consumes counter set {cs!r}, which the pool "
                                           "does not share")
            if missing:
                raise SliceValidationError(f"device {device.name}: consumes counters {', '.join(missing)} that "
                                           f"counter set {cs!r} does not have")
