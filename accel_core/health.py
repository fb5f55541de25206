"""Device health as every daemon reports it: healthy or not, a short reason word and a message.

Each accelerator has one rule that turns its discovery's typed facts into a :class:`DeviceHealth`; its device
plugin (ListAndWatch health) and its DRA driver (taints and the kubelet health stream) both use that rule.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable
from dataclasses import dataclass


@dataclass(frozen=True)
class DeviceHealth:
    """``reason`` is a short CamelCase word (the DRA taint value) when unhealthy; ``message`` says why."""

    healthy: bool
    reason: str = ""
    message: str = ""


HEALTHY = DeviceHealth(True)


class ProblemKind(enum.Enum):
    """What a host problem means for the device's health; the value is the reason word (taint value)."""

    DEVICE_MISSING = "DeviceMissing"
    """The device is gone from the driver's sysfs class (detached, driver unloaded)."""
    DEV_NODE_MISSING = "DevNodeMissing"
    """Its /dev node is missing or is not the device sysfs names: containers cannot use it."""
    LINK_DOWN = "PortDown"
    """A network port is not ACTIVE."""
    BAD_HOST_FILE = "HostFileError"
    """A file discovery needs for the device is unreadable or malformed."""


class Problem(str):
    """A host problem: the text (naming the file) for logs, plus a typed :class:`ProblemKind` for health rules.

    A plain ``str`` problem is informational (a fallback was used) and never changes health. Rules decide on
    ``kind``, never on the text.
    """

    kind: ProblemKind

    def __new__(cls, text: str, kind: ProblemKind) -> Problem:
        obj = super().__new__(cls, text)
        obj.kind = kind
        return obj

    def __reduce__(self) -> tuple[type[Problem], tuple[str, ProblemKind]]:
        return (Problem, (str(self), self.kind))


def kinds(problems: Iterable[str]) -> list[ProblemKind]:
    """The kinds of the typed problems among ``problems``, in order."""
    return [p.kind for p in problems if isinstance(p, Problem)]
