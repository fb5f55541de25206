"""Device health as every daemon reports it: healthy or not, a short reason word and a message.

Each accelerator has one rule that turns its discovery's typed facts into a :class:`DeviceHealth`; its device
plugin (ListAndWatch health) and its DRA driver (taints and the kubelet health stream) both use that rule.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class DeviceHealth:
    """``reason`` is a short CamelCase word (the DRA taint value) when unhealthy; ``message`` says why."""

    healthy: bool
    reason: str = ""
    message: str = ""


HEALTHY = DeviceHealth(True)
