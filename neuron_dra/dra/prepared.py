"""A prepared claim: which Neuron devices each request got and the environment its containers see.

This is what the checkpoint stores, and everything the CDI spec needs can be rebuilt from it without the API
server or the host (so a lost spec is re-created exactly after a restart or reboot).

CDI layout, kind ``k8s.neuron.aws.com/claim``, one transient spec per claim UID:

- ``<uid>-neuron-device-<i>``: device node ``/dev/neuron<i>``;
- ``<uid>-request-<request>``: the request's env, ``NEURON_RT_VISIBLE_CORES`` (all logical cores of the request's
  devices, numbered as the runtime in the container numbers them: see neuron_dra.runtime_env) and
  ``NEURON_LOGICAL_NC_CONFIG`` when the claim sets it.

The kubelet hands a container the CDI ids of the devices of the requests it references; the env device is
listed with the first device of each request, so every container gets it exactly once.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from accel_core.dra.types import ClaimError, PreparedDevice
from accel_core.edits import ContainerEdits, DeviceNode
from neuron_dra.discovery import NeuronInventory
from neuron_dra.dra.attributes import device_index, device_name
from neuron_dra.dra.claims import AllocatedClaim
from neuron_dra.dra.config import NeuronConfig
from neuron_dra.runtime_env import LNC_ENV, VISIBLE_CORES_ENV, format_core_list, visible_cores

STATE_STARTED = "PrepareStarted"
STATE_COMPLETED = "PrepareCompleted"


@dataclass(frozen=True)
class PreparedRequest:
    name: str
    indices: tuple[int, ...]
    env: tuple[tuple[str, str], ...]


@dataclass(frozen=True)
class PreparedClaim:
    uid: str
    namespace: str
    name: str
    pool: str
    requests: tuple[PreparedRequest, ...]
    state: str = STATE_COMPLETED

    @property
    def indices(self) -> tuple[int, ...]:
        return tuple(i for r in self.requests for i in r.indices)

    def with_state(self, state: str) -> PreparedClaim:
        return PreparedClaim(self.uid, self.namespace, self.name, self.pool, self.requests, state)

    def describe(self) -> str:
        return f"{self.namespace}/{self.name} (uid {self.uid})"

    # -- CDI -------------------------------------------------------------------------------------------------------
    def device_cdi_name(self, index: int) -> str:
        return f"{self.uid}-{device_name(index)}"

    def request_cdi_name(self, request: str) -> str:
        return f"{self.uid}-request-{request}"

    def cdi_devices(self) -> list[tuple[str, ContainerEdits]]:
        """(CDI device name, edits) for every device and every request's env."""
        out: list[tuple[str, ContainerEdits]] = []
        for req in self.requests:
            out.append((self.request_cdi_name(req.name), ContainerEdits(env=req.env)))
            for i in req.indices:
                out.append((self.device_cdi_name(i), ContainerEdits(device_nodes=(DeviceNode(f"/dev/neuron{i}"),))))
        return out

    def prepared_devices(self, qualify: Callable[[str], str]) -> list[PreparedDevice]:
        """The kubelet's view; ``qualify(name)`` turns a CDI device name into its fully qualified id."""
        out = []
        for req in self.requests:
            for pos, i in enumerate(req.indices):
                ids = [qualify(self.device_cdi_name(i))]
                if pos == 0:
                    ids.append(qualify(self.request_cdi_name(req.name)))
                out.append(PreparedDevice(self.pool, device_name(i), tuple(ids), (req.name,)))
        return out

    # -- checkpoint JSON -------------------------------------------------------------------------------------------
    def to_json(self) -> dict[str, Any]:
        return {
            "state": self.state, "namespace": self.namespace, "name": self.name, "pool": self.pool,
            "requests": [{"name": r.name, "devices": list(r.indices), "env": [list(kv) for kv in r.env]}
                         for r in self.requests],
        }

    @classmethod
    def from_json(cls, uid: str, data: Mapping[str, Any]) -> PreparedClaim:
        """Raises ValueError (naming the claim) for an entry that does not have the expected shape."""
        try:
            requests = tuple(
                PreparedRequest(str(r["name"]), tuple(int(i) for i in r["devices"]),
                                tuple((str(k), str(v)) for k, v in r["env"]))
                for r in data["requests"])
            state = str(data["state"])
            if state not in (STATE_STARTED, STATE_COMPLETED):
                raise ValueError(f"unknown state {state!r}")
            return cls(uid, str(data["namespace"]), str(data["name"]), str(data["pool"]), requests, state)
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"checkpoint entry for claim {uid} is malformed: {exc}") from exc


def plan_claim(alloc: AllocatedClaim, inv: NeuronInventory, configs: Mapping[str, NeuronConfig]) -> PreparedClaim:
    """Decide the devices and env of each request; ClaimError names an unknown device or an LNC mismatch."""
    by_index = {d.index: d for d in inv.devices}
    requests = []
    for request in alloc.requests:
        indices: list[int] = []
        for dev in (d for d in alloc.devices if d.request == request):
            index = device_index(dev.device)
            if index is None or index not in by_index:
                raise ClaimError(f"device {dev.device} (request {request}) is not a Neuron device of this node "
                                 f"(devices: {', '.join(device_name(i) for i in sorted(by_index)) or 'none'})")
            if not by_index[index].present:
                raise ClaimError(f"device {dev.device} (request {request}) is not present on this node: "
                                 f"{'; '.join(by_index[index].problems) or 'missing'}")
            indices.append(index)
        config = configs.get(request, NeuronConfig())
        lnc = config.logical_neuron_core
        if lnc is not None and not inv.lnc_applies:
            kind = inv.devices[0].device_name if inv.devices else inv.arch
            node = inv.instance_type or "this node"
            raise ClaimError(f"request {request}: logicalNeuronCore: {lnc} is set, but {node} ({kind}) has no "
                             "Logical NeuronCore setting")
        effective = lnc if lnc is not None else (inv.lnc if inv.lnc_applies else None)
        cores: list[int] = []
        per_device = 1
        for index in sorted(indices):
            per_device = max(1, by_index[index].core_count // (effective or 1))
            cores.extend(range(index * per_device, (index + 1) * per_device))
        env = [(VISIBLE_CORES_ENV, format_core_list(visible_cores(cores, per_device)))]
        if lnc is not None:
            env.append((LNC_ENV, str(lnc)))
        requests.append(PreparedRequest(request, tuple(sorted(indices)), tuple(env)))
    pool = alloc.devices[0].pool
    return PreparedClaim(alloc.ref.uid, alloc.ref.namespace, alloc.ref.name, pool, tuple(requests), STATE_STARTED)
