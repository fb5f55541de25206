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
from dataclasses import dataclass
from typing import Any

from accel_core.dra.types import PreparedDevice
from accel_core.edits import ContainerEdits, DeviceNode, Mount

STATE_STARTED = "PrepareStarted"
STATE_COMPLETED = "PrepareCompleted"


# -- container edits as checkpoint JSON --------------------------------------------------------------------------
def edits_to_json(edits: ContainerEdits) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if edits.device_nodes:
        out["deviceNodes"] = [{k: v for k, v in (("path", n.path), ("hostPath", n.host_path),
                                                 ("permissions", n.permissions), ("major", n.major),
                                                 ("minor", n.minor)) if v is not None}
                              for n in edits.device_nodes]
    if edits.env:
        out["env"] = [[k, v] for k, v in edits.env]
    if edits.mounts:
        out["mounts"] = [{"hostPath": m.host_path, "containerPath": m.container_path, "readOnly": m.read_only}
                         for m in edits.mounts]
    return out


def _opt_int(value: Any) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"expected an integer, got {value!r}")
    return value


def edits_from_json(data: Mapping[str, Any]) -> ContainerEdits:
    """Raises ValueError/KeyError/TypeError for a malformed object (the caller names the claim)."""
    nodes = tuple(DeviceNode(str(n["path"]), None if n.get("hostPath") is None else str(n["hostPath"]),
                             str(n.get("permissions", "rw")), _opt_int(n.get("major")), _opt_int(n.get("minor")))
                  for n in data.get("deviceNodes") or ())
    env = tuple((str(k), str(v)) for k, v in data.get("env") or ())
    mounts = tuple(Mount(str(m["hostPath"]), str(m["containerPath"]), bool(m.get("readOnly", True)))
                   for m in data.get("mounts") or ())
    return ContainerEdits(device_nodes=nodes, env=env, mounts=mounts)


@dataclass(frozen=True)
class PreparedRequest:
    """One request of a claim: its devices in order, each device's edits, and the request's own edits."""

    name: str
    devices: tuple[str, ...]
    device_edits: tuple[tuple[str, ContainerEdits], ...] = ()
    edits: ContainerEdits = ContainerEdits()

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

    @property
    def devices(self) -> tuple[str, ...]:
        """Every device of the claim, request by request."""
        return tuple(d for r in self.requests for d in r.devices)

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
        return {
            "state": self.state, "namespace": self.namespace, "name": self.name, "pool": self.pool,
            "requests": [{"name": r.name, "devices": list(r.devices),
                          "deviceEdits": {d: edits_to_json(e) for d, e in r.device_edits},
                          "edits": edits_to_json(r.edits)}
                         for r in self.requests],
        }

    @classmethod
    def from_json(cls, uid: str, data: Mapping[str, Any]) -> PreparedClaim:
        """Raises ValueError (naming the claim) for an entry that does not have the expected shape."""
        try:
            requests = tuple(
                PreparedRequest(str(r["name"]), tuple(str(d) for d in r["devices"]),
                                tuple((str(d), edits_from_json(e)) for d, e in (r.get("deviceEdits") or {}).items()),
                                edits_from_json(r.get("edits") or {}))
                for r in data["requests"])
            state = str(data["state"])
            if state not in (STATE_STARTED, STATE_COMPLETED):
                raise ValueError(f"unknown state {state!r}")
            return cls(uid, str(data["namespace"]), str(data["name"]), str(data["pool"]), requests, state)
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise ValueError(f"checkpoint entry for claim {uid} is malformed: {exc}") from exc
