"""The seam a DRA driver implements, and the small types that cross it."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from lightkube.resources.resource_v1 import ResourceClaim

#: Claim UID -> the claim as the API server returned it (None: it has none) or the exception its read raised.
ClaimReads = Mapping[str, "ResourceClaim | None | BaseException"]


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
    """What a DRA driver provides. The plugin calls it from a DRA server thread: ``claims_to_read`` and the claim
    reads outside its locks, then ``prepare_blocking`` (with the claims read) or ``unprepare_blocking`` under them
    (one request at a time). Each maps every claim UID of the request to its result or its exception; both must be
    idempotent."""

    @property
    def driver_name(self) -> str: ...

    def claims_to_read(self, claims: Sequence[ClaimRef], *, locked: bool = False) -> list[ClaimRef]:
        """The claims whose API objects a prepare of ``claims`` needs (those not prepared yet), once each. Cheap (no
        network); the plugin asks before its locks and, ``locked``, again under them (another process may have
        changed what is prepared meanwhile)."""
        ...

    def prepare_blocking(self, claims: Sequence[ClaimRef], reads: ClaimReads
                         ) -> Mapping[str, list[PreparedDevice] | Exception]:
        """Prepare the claims of one request from the claims read (each one ``claims_to_read`` named under the
        locks); a claim's failure is its ClaimError, with a message naming it."""
        ...

    def unprepare_blocking(self, claims: Sequence[ClaimRef]) -> Mapping[str, Exception | None]:
        """Unprepare the claims of one request (they may be deleted already); unknown claims are a no-op."""
        ...

    def health(self) -> list[DeviceHealthReport] | None:
        """The full health list now, or None if the driver does not report health."""
        ...
