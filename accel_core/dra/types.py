"""The seam a DRA driver implements, and the small types that cross it."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Protocol


@dataclass(frozen=True)
class ClaimRef:
    """A claim as the kubelet names it; the claim may already be gone from the API server."""

    namespace: str
    uid: str
    name: str

    def __str__(self) -> str:
        if max(len(self.namespace), len(self.name), len(self.uid)) > 253:  # hostile input: keep messages short
            return f"{self.namespace[:64]!r}/{self.name[:64]!r} (uid {self.uid[:64]!r})"
        return f"{self.namespace}/{self.name} (uid {self.uid})"


@dataclass(frozen=True)
class PreparedDevice:
    """One prepared device of a claim, as returned to the kubelet."""

    pool: str
    device: str
    cdi_device_ids: tuple[str, ...]
    request_names: tuple[str, ...] = ()
    share_id: str | None = None


@dataclass(frozen=True)
class DeviceStatusData:
    """What a driver says about one prepared device in the claim's ``status.devices``: driver-specific ``data``
    (a JSON object) and, for a device with a network interface, ``networkData`` (interfaceName, ips,
    hardwareAddress)."""

    data: Mapping[str, object] = field(default_factory=dict)
    network: Mapping[str, object] | None = None


@dataclass(frozen=True)
class DeviceHealthReport:
    """Health of one published device; ``healthy`` None means unknown."""

    pool: str
    device: str
    healthy: bool | None
    message: str = ""
    timeout_seconds: int = 0


class ClaimError(Exception):
    """A claim-level failure: reported in that claim's error field, not as a failed RPC."""


class DraHandler(Protocol):
    """What a DRA driver provides. Calls are serialized by the adapter; both must be idempotent."""

    @property
    def driver_name(self) -> str: ...

    async def prepare(self, claim: ClaimRef) -> list[PreparedDevice]:
        """Prepare one claim; raise ClaimError with a message naming the problem."""
        ...

    async def unprepare(self, claim: ClaimRef) -> None:
        """Unprepare one claim (it may be deleted already); unknown claims are a no-op."""
        ...

    def health(self) -> list[DeviceHealthReport] | None:
        """The full health list now, or None if the driver does not report health."""
        ...
