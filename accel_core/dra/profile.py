"""The seam a DRA driver implements: a *profile*. Everything else (sockets, registration, claim reading, config
precedence, the prepare state machine, the double-allocation check, checkpoint, CDI, stale-claim cleanup, slice
publishing, health stream, taints, liveness, CLI, metrics) is the core's and never changes for a new driver.

A profile says:

- ``driver_name`` (``efa.aws.com``), ``metrics_prefix`` (``efa_dra``);
- ``scanner``: the accelerator's host scanner (:class:`accel_core.hostscan.HostScanner`), the one its device
  plugin uses too: the core takes the watch paths, the health files it polls between rescans, the udev
  subsystems and the coexistence guard (publish and prepare nothing while the device plugin runs) from it;
- ``scan(paths, dra_version)``: the scanner's scan as the driver publishes it (called off the event loop): a
  :class:`Scan` with the inventory, the devices to publish (attributes and capacity, no taints), each device's
  health, the labels and annotations the driver keeps on its own Node, and the Node labels its devices carry as
  attributes;
- ``default_config`` and ``decode_config(parameters, where)``: the strict decoder of one opaque config, to a frozen
  dataclass whose unset fields are None;
- ``container_edits(inventory, request, devices, config)``: what the containers of one request get; raises
  :class:`~accel_core.dra.types.ClaimError` naming a device that is unknown or not usable here.

The core taints unhealthy devices ``<driver>/unhealthy=<reason>:NoSchedule`` (``NoExecute`` when the operator
chooses it, once the device stayed unhealthy ``--noexecute-after`` seconds: :mod:`accel_core.dra.taints`) and reports
the same health to the kubelet's health stream.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, Protocol, TypeVar

from accel_core.dra.slicemodel import AttributeValue, CounterSet, SliceDevice, Taint
from accel_core.dra.types import DeviceStatusData
from accel_core.edits import ContainerEdits
from accel_core.health import DeviceHealth
from accel_core.hostscan import HostScanner
from accel_core.paths import HostPaths

InventoryT = TypeVar("InventoryT")
ConfigT = TypeVar("ConfigT")


@dataclass(frozen=True)
class Scan(Generic[InventoryT]):
    """One look at the host, as the driver publishes it."""

    inventory: InventoryT
    devices: tuple[SliceDevice, ...]
    """The pool's devices in order, without taints (the core adds them from ``health``)."""
    health: Mapping[str, DeviceHealth] = field(default_factory=dict)
    """By device name; a published device without an entry is healthy."""
    problems: tuple[str, ...] = ()
    """Host problems, logged once when they appear and once when they clear; each names its file."""
    summary: Mapping[str, object] = field(default_factory=dict)
    """Fields for the start-up log line (instance type, device count...)."""
    node_labels: Mapping[str, str | None] = field(default_factory=dict)
    """Labels the driver keeps on its own Node (None removes one); see :class:`accel_core.ownnode.OwnNode`."""
    node_annotations: Mapping[str, str | None] = field(default_factory=dict)
    """Annotations the driver keeps on its own Node, the same way."""
    counters: tuple[CounterSet, ...] = ()
    """Counters the devices share (a device that consumes them all excludes the others)."""
    node_label_attributes: Mapping[str, str] = field(default_factory=dict)
    """Node label -> attribute added to every published device while the driver's Node has that label
    (:mod:`accel_core.dra.nodelabels`; ``AWS_TOPOLOGY_LABELS`` for AWS's topology and Capacity Block labels)."""


@dataclass(frozen=True)
class RequestEdits:
    """What the containers of one request get: per-device edits, plus the request's own (env, shared nodes)."""

    devices: Mapping[str, ContainerEdits]
    request: ContainerEdits = ContainerEdits()
    status: Mapping[str, DeviceStatusData] = field(default_factory=dict)
    """Per device: what the claim's ``status.devices`` says about it (devices left out get no entry)."""
    metadata: Mapping[str, Mapping[str, AttributeValue]] = field(default_factory=dict)
    """Per device: attributes only the node knows at prepare time, added to the published ones in the container's
    device metadata file (:mod:`accel_core.dra.metadata`)."""


class DraProfile(Protocol[InventoryT, ConfigT]):
    driver_name: str
    metrics_prefix: str
    default_config: ConfigT

    @property
    def scanner(self) -> HostScanner[InventoryT]: ...

    def scan(self, paths: HostPaths, dra_version: str) -> Scan[InventoryT]: ...

    def decode_config(self, parameters: Any, where: str) -> ConfigT: ...

    def container_edits(self, inventory: InventoryT, request: str, devices: Sequence[str],
                        config: ConfigT) -> RequestEdits: ...


def unhealthy_taint_key(driver: str) -> str:
    return f"{driver}/unhealthy"


#: The unhealthy-device taint effects an operator may choose: NoSchedule (the default) keeps new claims off the
#: device; NoExecute also evicts the pods whose claims use it (kube-controller-manager's device taint eviction).
UNHEALTHY_TAINT_EFFECTS = ("NoSchedule", "NoExecute")


def tainted(driver: str, devices: Sequence[SliceDevice], health: Mapping[str, DeviceHealth],
            effect: str = "NoSchedule") -> list[SliceDevice]:
    """The devices with ``<driver>/unhealthy=<reason>:<effect>`` on every unhealthy one, untimed (``slices``
    prints these; ``serve`` uses :class:`accel_core.dra.taints.UnhealthyTaints`)."""
    out = []
    for dev in devices:
        state = health.get(dev.name)
        if state is not None and not state.healthy:
            dev = dataclasses.replace(dev, taints=(Taint(unhealthy_taint_key(driver), state.reason, effect),))
        out.append(dev)
    return out
