"""Read a node's Neuron devices into a frozen :class:`~neuron_dra.inventory.NeuronInventory`: every device index the
driver, ``/dev`` or the instance catalog names, each read by :mod:`neuron_dra.driver_sysfs`, then checked against
the others and the catalog (core counts, links, topology), and the node-wide LNC setting, driver version and
UltraServer ids (:mod:`neuron_dra.ultraserver_sysfs`).

Nothing here raises for bad host files: each bad value becomes a problem string naming the file, and the value
falls back to the instance catalog (or the architecture's defaults). A problem that matters for health is a typed
:class:`~accel_core.health.Problem` (device gone, /dev node gone); :mod:`neuron_dra.health_rule` is the one rule that
turns these and the ECC counters into device health, for the device plugin and the DRA driver alike.

The inventory types, ``CLASS_DIR``, ``LNC_FILE`` and ``UNCORRECTED_COUNTERS`` are re-exported here: callers import
them together with :func:`discover`.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import replace

from accel_core.health import Problem, ProblemKind
from accel_core.paths import HostPaths
from neuron_dra.driver_sysfs import (
    DRIVER_VERSION_FILE,
    SysfsReader,
    device_indices,
    device_number,
    parse_connected,
    read_arch,
    read_core_count,
    read_instance_type_or_note,
    read_lnc,
    read_pci,
    read_uncorrected,
)
from neuron_dra.driver_sysfs import LNC_FILE as LNC_FILE
from neuron_dra.driver_sysfs import UNCORRECTED_COUNTERS as UNCORRECTED_COUNTERS
from neuron_dra.facts import arch as neuron_facts
from neuron_dra.instances import ExpectedLayout, expected_layout
from neuron_dra.inventory import NeuronDevice as NeuronDevice
from neuron_dra.inventory import NeuronInventory as NeuronInventory
from neuron_dra.presence import CLASS_DIR as CLASS_DIR
from neuron_dra.topology import Topology, build_topology
from neuron_dra.ultraserver_sysfs import read_ultraserver


def discover(paths: HostPaths, *, known: Iterable[int] = ()) -> NeuronInventory:
    """Read the host's Neuron devices. Never raises for bad host files (see the module docstring).

    ``known`` names device indices seen earlier: they stay in the inventory (``present=False``) if they vanish
    on a node whose instance type is not in the catalog, so health can report them.
    """
    reader = SysfsReader(paths)
    problems: list[str] = []
    instance_type = read_instance_type_or_note(paths, problems)
    expected = expected_layout(instance_type)
    indices = device_indices(reader, expected, known)

    raw: list[tuple[NeuronDevice, int | None, tuple[int, ...] | None, list[str]]] = []
    for index in indices:
        dev_problems: list[str] = []
        base = f"{CLASS_DIR}/neuron{index}"
        dev_node = f"/dev/neuron{index}"
        has_sysfs = reader.exists(base)
        has_node = reader.exists(dev_node)
        if not has_sysfs:
            dev_problems.append(Problem(f"{base}: missing (device gone from the driver)", ProblemKind.DEVICE_MISSING))
        if not has_node:
            dev_problems.append(Problem(f"{dev_node}: missing", ProblemKind.DEV_NODE_MISSING))
        present = has_sysfs and has_node
        arch, name = read_arch(reader, base, expected, instance_type)
        cores = read_core_count(reader, base, has_sysfs, dev_problems)
        connected: tuple[int, ...] | None = None
        if has_sysfs:
            text = reader.text(f"{base}/connected_devices", dev_problems)
            if text is not None:
                try:
                    connected = parse_connected(text)
                except ValueError as exc:
                    dev_problems.append(f"{base}/connected_devices: {exc}")
        bdf, numa, root = read_pci(reader, index, expected)
        facts = neuron_facts.ARCHES.get(arch)
        memory = expected.memory_bytes if expected is not None and expected.memory_bytes else (
            facts.memory_bytes if facts else 0)
        dev = NeuronDevice(
            index=index, core_count=0, connected=(), arch=arch, device_name=name, memory_bytes=memory,
            pci_address=bdf, numa_node=numa, pcie_root=root, dev_node=dev_node, present=present,
            uncorrected_errors=read_uncorrected(reader, base, has_sysfs, dev_problems),
        )
        raw.append((dev, cores, connected, dev_problems))

    consensus = _consensus_cores(raw, expected)
    index_set = set(indices)
    devices: list[NeuronDevice] = []
    for dev, cores, connected, dev_problems in raw:
        base = f"{CLASS_DIR}/neuron{dev.index}"
        if cores is not None and cores != consensus:
            dev_problems.append(f"{base}/core_count: {cores} differs from the node's {consensus}; using {consensus}")
        elif cores is None and dev.present:
            dev_problems.append(f"{base}/core_count: using {consensus} NeuronCores (catalog or architecture)")
        fallback = _expected_connected(expected, dev.index)
        if connected is not None:
            bad = [c for c in connected if c not in index_set or c == dev.index]
            if bad:
                dev_problems.append(f"{base}/connected_devices: names devices {bad} that do not exist on this node "
                                    f"(devices {indices[0]}..{indices[-1]}); using {_fallback_label(fallback)}")
                connected = None
        elif dev.present:
            dev_problems.append(f"{base}/connected_devices: using {_fallback_label(fallback)}")
        devices.append(replace(dev, core_count=consensus, problems=tuple(dev_problems),
                               connected=connected if connected is not None else (fallback or ())))

    topology, topo_problems = _topology(devices, expected)
    problems.extend(topo_problems)
    if expected is not None and expected.device_count and len(devices) != expected.device_count:
        problems.append(f"{CLASS_DIR}: {len(devices)} devices but {instance_type} has {expected.device_count}")
    arch = Counter(d.arch for d in devices).most_common(1)[0][0] if devices else (expected.arch if expected else "")
    applies = arch in neuron_facts.LNC_ARCHES
    lnc = read_lnc(reader, applies, problems)
    version_problems: list[str] = []
    driver_version = reader.label(DRIVER_VERSION_FILE, version_problems)
    if devices and driver_version is None:
        problems.extend(f"{p}; Neuron driver version unknown" for p in version_problems or
                        [f"{DRIVER_VERSION_FILE}: missing"])
    ids = read_ultraserver(reader, problems) if devices else None
    return NeuronInventory(instance_type, tuple(devices), lnc, applies, driver_version, topology, tuple(problems),
                           ids)


def refresh_state(paths: HostPaths, inventory: NeuronInventory) -> NeuronInventory | None:
    """Cheap re-read of what changes at run time: presence and uncorrected ECC counters of known devices.

    Returns the inventory with those fields updated, or None when the set of devices or their presence changed
    (then a full :func:`discover` is needed to explain it).
    """
    reader = SysfsReader(paths)
    quiet: list[str] = []
    if inventory.devices and read_ultraserver(reader, quiet) != inventory.ultraserver:
        return None
    names = {n for n in reader.listdir(CLASS_DIR) if device_number(n) is not None}
    known = {f"neuron{d.index}" for d in inventory.devices}
    if not names <= known:
        return None
    devices = []
    for dev in inventory.devices:
        base = f"{CLASS_DIR}/neuron{dev.index}"
        present = f"neuron{dev.index}" in names and reader.exists(dev.dev_node)
        if present != dev.present:
            return None
        if not present:
            devices.append(dev)
            continue
        problems: list[str] = []
        errors = read_uncorrected(reader, base, True, problems)
        if problems:
            return None  # a counter went bad: let the full scan report it
        devices.append(dev if errors == dev.uncorrected_errors else replace(dev, uncorrected_errors=errors))
    return replace(inventory, devices=tuple(devices))

def _consensus_cores(
    raw: list[tuple[NeuronDevice, int | None, tuple[int, ...] | None, list[str]]], expected: ExpectedLayout | None
) -> int:
    """Physical cores per device for the node: the catalog's, else the most common valid value, else the arch's."""
    if expected is not None and expected.physical_cores:
        return expected.physical_cores
    valid = [cores for _, cores, _, _ in raw if cores is not None]
    if valid:
        return Counter(valid).most_common(1)[0][0]
    for dev, *_ in raw:
        facts = neuron_facts.ARCHES.get(dev.arch)
        if facts is not None:
            return facts.physical_cores
    return 1 if raw else 0


def _expected_connected(expected: ExpectedLayout | None, index: int) -> tuple[int, ...] | None:
    if expected is None or index >= len(expected.connected):
        return None
    return expected.connected[index]


def _fallback_label(fallback: tuple[int, ...] | None) -> str:
    return f"the catalog's {list(fallback)}" if fallback is not None else "no links (instance type not in the catalog)"


def _topology(devices: list[NeuronDevice], expected: ExpectedLayout | None) -> tuple[Topology, list[str]]:
    if devices and [d.index for d in devices] != list(range(len(devices))):
        return (Topology("none", len(devices), tuple(() for _ in devices), "fallback"),
                [f"{CLASS_DIR}: device indices {[d.index for d in devices]} are not 0..{len(devices) - 1}; "
                 "treating the devices as unconnected"])
    return build_topology(
        [d.connected for d in devices],
        expected_kind=expected.topology if expected is not None and expected.device_count else None,
        expected_connected=expected.connected if expected is not None else (),
        where=f"{CLASS_DIR}/neuron*/connected_devices",
    )
