"""The UltraServer side of ``neuron.aws.com``: the ``neuron_node`` device and what an ``UltraServerConfig`` sets.

On a node of an UltraServer (trn2u) the pool holds, beside ``neuron-device-<i>`` per chip, one device
``neuron-node``: the node's share of the UltraServer (all its chips). Chips and the node device exclude each other
through one shared counter: counter set ``neuron-chips`` holds ``chips`` = the node's chip count, each chip
consumes 1 and the node device consumes all of them, so the scheduler gives the node device only while no chip is
allocated and no chip while the node device is. With core devices (:mod:`.cores`) the set also counts ``cores``
(the node's physical cores): each core device consumes its own and the node device all of them.

Prepare of the node device gives the container every ``/dev/neuron<i>``. With an ``UltraServerConfig`` it also
sets the runtime's UltraServer env (neuron.md 2.5); the choices no public document makes are in
:mod:`neuron_dra.facts.ultraserver` and docs/neuron-dra-driver.md ("UltraServer choices").
"""

from __future__ import annotations

from accel_core.dra.slicemodel import AttributeValue, CounterSet, SliceDevice, Version
from accel_core.dra.types import ClaimError
from neuron_dra.facts import ultraserver as us
from neuron_dra.facts.ultraserver import UltraServerIds

NODE_DEVICE = "neuron-node"
NODE_RESOURCE_TYPE = "neuron_node"
COUNTER_SET = "neuron-chips"
COUNTER = "chips"
CORES_COUNTER = "cores"
"""With core devices on: the node's physical cores; each core device consumes its own (its chip consumes 1 chip)."""


def _counts(chips: int, cores: int) -> dict[str, int]:
    """The node's counters: every chip, and with core devices every physical core."""
    return {COUNTER: chips, **({CORES_COUNTER: cores} if cores else {})}


def chip_counters(chips: int, cores: int = 0) -> CounterSet:
    return CounterSet(COUNTER_SET, _counts(chips, cores))


def chip_consumes() -> dict[str, dict[str, int]]:
    """What one chip device consumes."""
    return {COUNTER_SET: {COUNTER: 1}}


def core_consumes(physical_cores: int) -> dict[str, dict[str, int]]:
    """What one core device consumes (core devices on): its physical cores, so ``neuron-node`` waits for them."""
    return {COUNTER_SET: {CORES_COUNTER: physical_cores}}


def node_attributes(ids: UltraServerIds, instance_type: str, driver_version: str | None,
                    dra_version: str) -> dict[str, AttributeValue]:
    attrs: dict[str, AttributeValue] = {
        "resourceType": NODE_RESOURCE_TYPE,
        "draDriverVersion": Version(dra_version),
        "ultraserverId": ids.server_id_4,
        "serverId2": ids.server_id_2,
        "nodeId2": ids.node_id_2,
        "serverId4": ids.server_id_4,
        "nodeId4": ids.node_id_4,
        "ultraserverModes": "busy" if ids.busy else us.mode_label(ids.set_sizes()),
    }
    if instance_type:
        attrs["instanceType"] = instance_type
    if driver_version:
        attrs["neuronDriverVersion"] = driver_version
    return attrs


def node_device(ids: UltraServerIds, instance_type: str, driver_version: str | None, dra_version: str,
                chips: int, cores: int = 0) -> SliceDevice:
    """The node's share of the UltraServer: consumes every chip's counter (and, with core devices, every core's);
    no capacity (as the chips)."""
    return SliceDevice(NODE_DEVICE, node_attributes(ids, instance_type, driver_version, dra_version),
                       consumes={COUNTER_SET: _counts(chips, cores)})


def runtime_env(ids: UltraServerIds | None, mode: int, request: str, node: str) -> list[tuple[str, str]]:
    """The UltraServer env for a set of ``mode`` nodes; ClaimError when this node cannot join such a set."""
    where = f"request {request}: UltraServerConfig ultraserverMode: {mode}"
    if ids is None:
        raise ClaimError(f"{where}, but {node} is not part of an UltraServer")
    if ids.busy:
        raise ClaimError(f"{where}, but the Neuron driver on {node} reports ultraserver_mode 'busy' (an UltraServer "
                         "election is running); the kubelet retries prepare")
    runtime = ids.runtime_mode(mode)
    if runtime is None:
        supported = ", ".join(map(str, ids.set_sizes())) or "none"
        raise ClaimError(f"{where} is not supported by {node} (supported set sizes: {supported})")
    node_id = ids.node_id(mode)
    return [
        (us.ENV_MODE, str(runtime)),
        (us.ENV_SERVER_ID, ids.server_id(mode)),
        (us.ENV_NODE_ID, str(node_id)),
        (us.ENV_GLOBAL_TOPOID, str(node_id)),
    ]
