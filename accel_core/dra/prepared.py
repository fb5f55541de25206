"""A prepared claim: which devices each request got and the container edits of each device and request.

This is what the checkpoint stores, and everything the CDI spec and the kubelet's answer need can be rebuilt from
it without the API server or the host (so a lost spec is re-created exactly after a restart or a reboot).

CDI layout, kind ``k8s.<driver>/claim``, one transient spec per claim UID:

- ``<uid>-<device>``: that device's edits (its device nodes);
- ``<uid>-request-<request>``: the request's own edits (environment, shared device nodes), when there are any.

The kubelet hands a container the CDI ids of the devices of the requests it references; a request's own entry
is listed with the first device of that request, so every container gets it exactly once per request.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

import msgspec

from accel_core.dra.types import DeviceStatusData, PreparedDevice
from accel_core.edits import ContainerEdits, DeviceNode, Mount

STATE_STARTED = "PrepareStarted"
STATE_COMPLETED = "PrepareCompleted"


# -- the checkpoint entry, as strict msgspec types (layout v1; see accel_core/dra/checkpoint.py) ------------------
class _Node(msgspec.Struct, frozen=True, forbid_unknown_fields=True, omit_defaults=True, rename="camel"):
    path: str
    host_path: str | None = None
    permissions: str = "rw"
    major: int | None = None
    minor: int | None = None


class _Mount(msgspec.Struct, frozen=True, forbid_unknown_fields=True, rename="camel"):
    host_path: str
    container_path: str
    read_only: bool = True


class _Edits(msgspec.Struct, frozen=True, forbid_unknown_fields=True, omit_defaults=True, rename="camel"):
    device_nodes: tuple[_Node, ...] = ()
    env: tuple[tuple[str, str], ...] = ()
    mounts: tuple[_Mount, ...] = ()


class _Request(msgspec.Struct, frozen=True, forbid_unknown_fields=True, omit_defaults=True, rename="camel"):
    name: str
    devices: tuple[str, ...]
    device_edits: dict[str, _Edits] = {}
    edits: _Edits = _Edits()
    admin_access: bool = False  # written only when true: entries without it read as before


class _Entry(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    state: Literal["PrepareStarted", "PrepareCompleted"]
    namespace: str
    name: str
    pool: str
    requests: tuple[_Request, ...]


def entry_format(entry: Mapping[str, Any]) -> int:
    """The checkpoint format an entry needs (accel_core/dra/checkpoint.py, "Versions"): 2 when a request carries
    ``adminAccess``, else 1 (what every earlier driver reads)."""
    requests = entry.get("requests")
    if isinstance(requests, list | tuple) and any(isinstance(r, dict) and r.get("adminAccess") for r in requests):
        return 2
    return 1


def _edits_entry(edits: ContainerEdits) -> _Edits:
    return _Edits(tuple(_Node(n.path, n.host_path, n.permissions, n.major, n.minor) for n in edits.device_nodes),
                  tuple(edits.env), tuple(_Mount(m.host_path, m.container_path, m.read_only) for m in edits.mounts))


def _edits(entry: _Edits) -> ContainerEdits:
    return ContainerEdits(device_nodes=tuple(DeviceNode(n.path, n.host_path, n.permissions, n.major, n.minor)
                                             for n in entry.device_nodes),
                          env=entry.env,
                          mounts=tuple(Mount(m.host_path, m.container_path, m.read_only) for m in entry.mounts))


@dataclass(frozen=True)
class PreparedRequest:
    """One request of a claim: its devices in order, each device's edits, and the request's own edits.
    ``admin_access``: allocated with ``adminAccess`` (monitoring), so it holds none of its devices."""

    name: str
    devices: tuple[str, ...]
    device_edits: tuple[tuple[str, ContainerEdits], ...] = ()
    edits: ContainerEdits = ContainerEdits()
    admin_access: bool = False

    def edits_of(self, device: str) -> ContainerEdits:
        return dict(self.device_edits).get(device, ContainerEdits())


@dataclass(frozen=True)
class PreparedClaim:
    uid: str
    namespace: str
    name: str
    pool: str
    requests: tuple[PreparedRequest, ...]
    state: str = STATE_COMPLETED
    #: (device, status) for the claim's ``status.devices``, from the prepare that planned it; not checkpointed.
    status: tuple[tuple[str, DeviceStatusData], ...] = field(default=(), compare=False, repr=False)

    @property
    def devices(self) -> tuple[str, ...]:
        """Every device of the claim, request by request."""
        return tuple(d for r in self.requests for d in r.devices)

    @property
    def held_devices(self) -> tuple[str, ...]:
        """The devices the claim holds: those of its requests without admin access."""
        return tuple(d for r in self.requests if not r.admin_access for d in r.devices)

    def with_state(self, state: str) -> PreparedClaim:
        return PreparedClaim(self.uid, self.namespace, self.name, self.pool, self.requests, state)

    def describe(self) -> str:
        return f"{self.namespace}/{self.name} (uid {self.uid})"

    # -- CDI -------------------------------------------------------------------------------------------------------
    def device_cdi_name(self, device: str) -> str:
        return f"{self.uid}-{device}"

    def request_cdi_name(self, request: str) -> str:
        return f"{self.uid}-request-{request}"

    def cdi_devices(self) -> list[tuple[str, ContainerEdits]]:
        """(CDI device name, edits) for every request's own edits and every device."""
        out: list[tuple[str, ContainerEdits]] = []
        for req in self.requests:
            if req.edits != ContainerEdits():
                out.append((self.request_cdi_name(req.name), req.edits))
            for dev in req.devices:
                out.append((self.device_cdi_name(dev), req.edits_of(dev)))
        return out

    def prepared_devices(self, qualify: Callable[[str], str]) -> list[PreparedDevice]:
        """The kubelet's view; ``qualify(name)`` turns a CDI device name into its fully qualified id."""
        out = []
        for req in self.requests:
            for pos, dev in enumerate(req.devices):
                ids = [qualify(self.device_cdi_name(dev))]
                if pos == 0 and req.edits != ContainerEdits():
                    ids.append(qualify(self.request_cdi_name(req.name)))
                out.append(PreparedDevice(self.pool, dev, tuple(ids), (req.name,)))
        return out

    # -- checkpoint JSON -------------------------------------------------------------------------------------------
    def to_json(self) -> dict[str, Any]:
        entry = _Entry(self.state, self.namespace, self.name, self.pool,  # type: ignore[arg-type]
                       tuple(_Request(r.name, r.devices, {d: _edits_entry(e) for d, e in r.device_edits},
                                      _edits_entry(r.edits), r.admin_access) for r in self.requests))
        out: dict[str, Any] = msgspec.to_builtins(entry)
        return out

    @classmethod
    def from_json(cls, uid: str, data: Mapping[str, Any]) -> PreparedClaim:
        """Raises ValueError (naming the claim and the field) for an entry that does not have the v1 layout
        exactly: no coercion (a number where a name belongs is an error), no unknown field."""
        try:
            entry = msgspec.convert(data, _Entry)
        except msgspec.ValidationError as exc:
            raise ValueError(f"checkpoint entry for claim {uid} is malformed: {exc}") from exc
        requests = tuple(PreparedRequest(r.name, r.devices, tuple((d, _edits(e)) for d, e in r.device_edits.items()),
                                         _edits(r.edits), r.admin_access) for r in entry.requests)
        return cls(uid, entry.namespace, entry.name, entry.pool, requests, entry.state)
