"""The one health rule for EFA devices, used by the EFA device plugin and the EFA DRA driver alike (through
:mod:`efa_plugin.scanner`).

A device is healthy when discovery found no problem with it. Otherwise the reason (the DRA taint value) is the
kind of its first typed problem: ``DeviceMissing`` (gone from sysfs), ``DevNodeMissing`` (its
``/dev/infiniband/uverbsN`` is missing or is another device), ``PortDown`` (a port is not ACTIVE) or
``HostFileError`` (a file it needs is unreadable or malformed). The rule keeps no state: a device is healthy again
as soon as the host looks right again (port back to ACTIVE, device back). Message text is never parsed.

Port state changes without an event on real sysfs: both daemons poll the files :func:`port_state_files` names
between their full rescans.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from pathlib import Path

from accel_core.health import HEALTHY, DeviceHealth, Problem, ProblemKind, kinds
from efa_plugin.discovery import CLASS_IB, CLASS_VERBS, EfaDevice

MESSAGE_MAX = 512


def device_health(dev: EfaDevice) -> DeviceHealth:
    if not dev.problems:
        return HEALTHY
    found = kinds(dev.problems)
    reason = (found[0] if found else ProblemKind.BAD_HOST_FILE).value
    message = "; ".join(dev.problems)
    return DeviceHealth(False, reason, message if len(message) <= MESSAGE_MAX else message[:MESSAGE_MAX - 3] + "...")


def vanished(dev: EfaDevice) -> EfaDevice:
    """A device seen earlier whose sysfs entries are gone: kept, with a DeviceMissing problem."""
    gone = Problem(f"{CLASS_IB}/{dev.ibdev} and {CLASS_VERBS}/{dev.uverbs} are gone (device detached?)",
                   ProblemKind.DEVICE_MISSING)
    return dataclasses.replace(dev, problems=(gone,))


def present(dev: EfaDevice) -> bool:
    """The device is on the host with a usable device node (it can be handed to a container)."""
    found = kinds(dev.problems)
    return ProblemKind.DEVICE_MISSING not in found and ProblemKind.DEV_NODE_MISSING not in found


def port_state_files(devices: Iterable[EfaDevice]) -> list[Path]:
    """Every port's ``state`` file of ``devices``, in order."""
    return [dev.sysfs_dir / "ports" / str(port) / "state" for dev in devices for port, _ in dev.port_states]
