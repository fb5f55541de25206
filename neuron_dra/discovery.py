"""Read a node's Neuron devices into a frozen :class:`NeuronInventory`.

Sources (all below the host root of :class:`~accel_core.paths.HostPaths`):

- ``/sys/class/neuron_device/neuronN/``: ``core_count`` (physical NeuronCores), ``connected_devices``
  (``"12, 3, 4, 1"``), ``info/architecture/{instance_type,device_name}``, ``stats/hardware/*_uncorrected``;
- ``/dev/neuronN``: the character device a container gets;
- ``/sys/class/dmi/id/product_name``: the EC2 instance type;
- ``/opt/aws/neuron/logical_nc_config``: ``NEURON_LOGICAL_NC_CONFIG=1|2`` (Trainium2 and later only; default 2);
- ``/sys/module/neuron/version``: the driver version;
- ``/sys/bus/pci/devices/<bdf>/numa_node``: NUMA node and PCIe root of a device. The Neuron class device has no
  PCI parent link, so the device index -> PCI address map comes from the instance catalog and is used only when
  that PCI function is really there.

Nothing here raises for bad host files: each bad value becomes a problem string naming the file, and the value
falls back to the instance catalog (or the architecture's defaults). A problem that matters for health is a typed
:class:`~accel_core.health.Problem` (device gone, /dev node gone); :mod:`neuron_dra.health_rule` is the one rule that
turns these and the ECC counters into device health, for the device plugin and the DRA driver alike.
"""

from __future__ import annotations

import os
import re
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, replace
from pathlib import Path

from accel_core.awsfacts import neuron as neuron_facts
from accel_core.awsfacts import ultraserver as us_facts
from accel_core.awsfacts.ultraserver import UltraServerIds
from accel_core.health import Problem, ProblemKind
from accel_core.hostfiles import (
    HostValueError,
    describe,
    is_missing,
    parse_index,
    parse_int,
    printable,
    read_attr_bytes,
    read_label,
)
from accel_core.hostinfo import DMI_PRODUCT_NAMES, pcie_root, read_instance_type
from accel_core.paths import HostPaths
from neuron_dra.instances import ExpectedLayout, expected_layout
from neuron_dra.presence import CLASS_DIR as CLASS_DIR
from neuron_dra.topology import Topology, build_topology

LNC_FILE = "/opt/aws/neuron/logical_nc_config"
LNC_KEY = "NEURON_LOGICAL_NC_CONFIG"
DRIVER_VERSION_FILE = "/sys/module/neuron/version"
PCI_DEVICES_DIR = "/sys/bus/pci/devices"
NEURON_PCI_VENDOR = "0x1d0f"
MAX_CORES_PER_DEVICE = 8
MAX_DEVICES = 1024
"""No instance has more; a larger index in a name or in ``connected_devices`` is garbage."""
MAX_NUMA_NODE = 4095
CONFIG_FILE_LIMIT = 64 * 1024
"""``/opt/aws/neuron/logical_nc_config`` is a small env file; sysfs attributes stay within one page."""
UNCORRECTED_COUNTERS = ("mem_ecc_uncorrected", "sram_ecc_uncorrected")
"""Hardware counters whose rise makes a device unhealthy (``mem_ecc_repairable_uncorrected`` is only reported)."""


def _device_number(name: str) -> int | None:
    """``neuron3`` -> 3 (ASCII digits only); None for any other entry."""
    return parse_index(name, "neuron", maximum=MAX_DEVICES - 1)


@dataclass(frozen=True)
class NeuronDevice:
    """One Neuron device (chip) as found on the host."""

    index: int
    core_count: int
    """Physical NeuronCores (``core_count`` in sysfs)."""
    connected: tuple[int, ...]
    """Neighbour device indices, in driver order."""
    arch: str
    """``inf1``, ``inf2``, ``trn1``, ``trn2``, ``trn3`` (``unknown`` if nothing says)."""
    device_name: str
    memory_bytes: int
    pci_address: str | None
    numa_node: int | None
    pcie_root: str | None
    dev_node: str
    """``/dev/neuronN`` as the host names it (not prefixed with the host root)."""
    present: bool
    """Both the sysfs entry and the /dev node exist."""
    uncorrected_errors: int
    """Sum of the uncorrected ECC counters (memory and SRAM)."""
    problems: tuple[str, ...] = ()


@dataclass(frozen=True)
class NeuronInventory:
    """Every Neuron device of a node plus node-wide settings. Devices are sorted by index."""

    instance_type: str
    devices: tuple[NeuronDevice, ...]
    lnc: int | None
    """Logical NeuronCore setting (1 or 2); None where LNC does not apply."""
    lnc_applies: bool
    driver_version: str | None
    topology: Topology
    problems: tuple[str, ...] = ()
    ultraserver: UltraServerIds | None = None
    """This node's place in an UltraServer (class attributes); None outside one or when they are unreadable."""

    @property
    def arch(self) -> str:
        """The node's Neuron architecture (the most common among its devices)."""
        if not self.devices:
            return neuron_facts.arch_from_instance_type(self.instance_type) or "unknown"
        return Counter(d.arch for d in self.devices).most_common(1)[0][0]

    def physical_cores_per_device(self) -> int:
        return self.devices[0].core_count if self.devices else 0

    def logical_cores_per_device(self) -> int:
        """NeuronCores the runtime sees per device: physical cores divided by the LNC setting (at least 1)."""
        physical = self.physical_cores_per_device()
        if physical <= 0:
            return 0
        return max(1, physical // (self.lnc or 1))

    def total_logical_cores(self) -> int:
        return self.logical_cores_per_device() * len(self.devices)

    def device(self, index: int) -> NeuronDevice:
        """The device with ``index``; KeyError naming the known indices otherwise."""
        for dev in self.devices:
            if dev.index == index:
                return dev
        raise KeyError(f"no Neuron device {index} (devices: {[d.index for d in self.devices]})")

    def all_problems(self) -> list[str]:
        """Node-wide problems followed by every device's problems."""
        return [*self.problems, *(p for d in self.devices for p in d.problems)]


# --------------------------------------------------------------------------------------------- file helpers


class _Reader:
    """Reads small host files; errors become problems naming the host path (as seen on the node)."""

    def __init__(self, paths: HostPaths) -> None:
        self.paths = paths

    def real(self, host_path: str) -> Path:
        return self.paths.host(host_path)

    def exists(self, host_path: str) -> bool:
        return os.path.exists(self.real(host_path))

    def text(self, host_path: str, problems: list[str], *, required: bool = True,
             limit: int | None = None) -> str | None:
        """The UTF-8 text of a small regular file (never a FIFO, a directory or more than a page)."""
        try:
            data = read_attr_bytes(str(self.real(host_path)), printable(host_path),
                                   **({"limit": limit} if limit else {}))
            return data.decode("utf-8")
        except UnicodeDecodeError:
            problems.append(f"{printable(host_path)}: unreadable (not UTF-8 text)")
        except HostValueError as exc:
            if required or not is_missing(exc):
                problems.append(str(exc))
        return None

    def label(self, host_path: str, problems: list[str]) -> str | None:
        """A short printable value (version, device name); absent files are not a problem."""
        try:
            return read_label(str(self.real(host_path)), printable(host_path)) or None
        except HostValueError as exc:
            if not is_missing(exc):
                problems.append(str(exc))
            return None

    def int_value(self, host_path: str, problems: list[str], *, required: bool = True, minimum: int = 0,
                  maximum: int | None = None) -> int | None:
        text = self.text(host_path, problems, required=required)
        if text is None:
            return None
        try:
            return parse_int(text, printable(host_path), minimum=minimum,
                             **({"maximum": maximum} if maximum is not None else {}))
        except HostValueError as exc:
            problems.append(str(exc))
            return None

    def listdir(self, host_path: str) -> list[str]:
        try:
            return os.listdir(self.real(host_path))
        except OSError:
            return []


def _show(text: str, limit: int = 40) -> str:
    return describe(text.strip(), limit)


def parse_connected(text: str) -> tuple[int, ...]:
    """``"12, 3, 4, 1\\n"`` -> ``(12, 3, 4, 1)``; an empty line -> ``()``. ValueError for anything else."""
    body = text.strip()
    if not body:
        return ()
    parts = [p for p in re.split(r"[, \t\n]+", body) if p]
    values = tuple(parse_index(p, maximum=MAX_DEVICES - 1) for p in parts)
    if any(v is None for v in values):
        raise ValueError(f"expected comma-separated device indices below {MAX_DEVICES}, got {_show(text)}")
    if len(set(values)) != len(values):
        raise ValueError(f"device indices repeat in {_show(text)}")
    return tuple(v for v in values if v is not None)


def parse_lnc(text: str) -> int:
    """The value of ``NEURON_LOGICAL_NC_CONFIG=N`` (or a bare ``N``); ValueError unless it is 1 or 2."""
    value: str | None = None
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if line.startswith("export "):
            line = line[len("export "):].strip()
        if "=" in line:
            key, _, rest = line.partition("=")
            if key.strip() != LNC_KEY:
                continue
            value = rest.strip().strip("'\"")
        elif value is None:
            value = line
    if value is None:
        raise ValueError(f"no {LNC_KEY}=1|2 line in {_show(text)}")
    if value not in ("1", "2"):
        raise ValueError(f"{LNC_KEY} must be 1 or 2, got {value!r}")
    return int(value)


# --------------------------------------------------------------------------------------------- discovery


def _instance_type(paths: HostPaths, problems: list[str]) -> str:
    found = read_instance_type(paths, problems)
    if found is None:
        problems.append(f"{DMI_PRODUCT_NAMES[0]}: missing or empty; instance type unknown, no catalog fallback")
    return found or ""


def _device_indices(reader: _Reader, expected: ExpectedLayout | None, known: Iterable[int]) -> list[int]:
    found: set[int] = set(known)
    for name in [*reader.listdir(CLASS_DIR), *reader.listdir("/dev")]:
        number = _device_number(name)
        if number is not None:
            found.add(number)
    if expected is not None:
        found.update(range(expected.device_count))
    return sorted(found)


def _arch_of(reader: _Reader, base: str, expected: ExpectedLayout | None, instance_type: str) -> tuple[str, str]:
    """(arch, device_name) from the device's architecture files, then the catalog, then the instance type."""
    quiet: list[str] = []
    itype = (reader.label(f"{base}/info/architecture/instance_type", quiet) or "").lower()
    name = reader.label(f"{base}/info/architecture/device_name", quiet) or ""
    arch = (itype if itype in neuron_facts.ARCHES else None) or neuron_facts.arch_from_device_name(name)
    if arch is None and expected is not None and expected.arch:
        arch = expected.arch
    if arch is None:
        arch = neuron_facts.arch_from_instance_type(instance_type) or "unknown"
    if not name:
        facts = neuron_facts.ARCHES.get(arch)
        name = facts.device_name if facts else ""
    return arch, name


def _core_count(reader: _Reader, base: str, present: bool, problems: list[str]) -> int | None:
    if not present:
        return None
    path = f"{base}/core_count"
    text = reader.text(path, problems)
    if text is None:
        return None
    try:
        value = parse_int(text, path)
    except HostValueError:
        problems.append(f"{path}: expected a number of NeuronCores, got {_show(text)}")
        return None
    if not 1 <= value <= MAX_CORES_PER_DEVICE:
        problems.append(f"{path}: {value} NeuronCores is outside 1..{MAX_CORES_PER_DEVICE}")
        return None
    return value


def _uncorrected(reader: _Reader, base: str, present: bool, problems: list[str]) -> int:
    if not present:
        return 0
    total = 0
    for name in UNCORRECTED_COUNTERS:
        path = f"{base}/stats/hardware/{name}"
        if os.path.isdir(reader.real(path)):
            path = f"{path}/total"
        value = reader.int_value(path, problems, required=False)
        if value is not None:
            total += value
    return total


def _pci(reader: _Reader, index: int, expected: ExpectedLayout | None) -> tuple[str | None, int | None, str | None]:
    """(address, numa node, PCIe root) for a device, if the catalog's address is a Neuron PCI function here."""
    if expected is None or index >= len(expected.pci_addresses):
        return None, None, None
    bdf = expected.pci_addresses[index]
    base = f"{PCI_DEVICES_DIR}/{bdf}"
    quiet: list[str] = []
    vendor = (reader.text(f"{base}/vendor", quiet, required=False) or "").strip().lower()
    if vendor != NEURON_PCI_VENDOR:
        return None, None, None
    numa = reader.int_value(f"{base}/numa_node", quiet, required=False, minimum=-1, maximum=MAX_NUMA_NODE)
    root = pcie_root(reader.paths, os.path.realpath(reader.real(base)))
    return bdf, (numa if numa is not None and numa >= 0 else None), root


def _read_lnc(reader: _Reader, applies: bool, problems: list[str]) -> int | None:
    if not applies:
        return None
    text = reader.text(LNC_FILE, problems, required=False, limit=CONFIG_FILE_LIMIT)
    if text is None:
        return neuron_facts.DEFAULT_LNC
    try:
        return parse_lnc(text)
    except ValueError as exc:
        problems.append(f"{LNC_FILE}: {exc}; using LNC {neuron_facts.DEFAULT_LNC}")
        return neuron_facts.DEFAULT_LNC


def discover(paths: HostPaths, *, known: Iterable[int] = ()) -> NeuronInventory:
    """Read the host's Neuron devices. Never raises for bad host files (see the module docstring).

    ``known`` names device indices seen earlier: they stay in the inventory (``present=False``) if they vanish
    on a node whose instance type is not in the catalog, so health can report them.
    """
    reader = _Reader(paths)
    problems: list[str] = []
    instance_type = _instance_type(paths, problems)
    expected = expected_layout(instance_type)
    indices = _device_indices(reader, expected, known)

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
        arch, name = _arch_of(reader, base, expected, instance_type)
        cores = _core_count(reader, base, has_sysfs, dev_problems)
        connected: tuple[int, ...] | None = None
        if has_sysfs:
            text = reader.text(f"{base}/connected_devices", dev_problems)
            if text is not None:
                try:
                    connected = parse_connected(text)
                except ValueError as exc:
                    dev_problems.append(f"{base}/connected_devices: {exc}")
        bdf, numa, root = _pci(reader, index, expected)
        facts = neuron_facts.ARCHES.get(arch)
        memory = expected.memory_bytes if expected is not None and expected.memory_bytes else (
            facts.memory_bytes if facts else 0)
        dev = NeuronDevice(
            index=index, core_count=0, connected=(), arch=arch, device_name=name, memory_bytes=memory,
            pci_address=bdf, numa_node=numa, pcie_root=root, dev_node=dev_node, present=present,
            uncorrected_errors=_uncorrected(reader, base, has_sysfs, dev_problems),
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
    lnc = _read_lnc(reader, applies, problems)
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
    reader = _Reader(paths)
    quiet: list[str] = []
    if inventory.devices and read_ultraserver(reader, quiet) != inventory.ultraserver:
        return None
    names = {n for n in reader.listdir(CLASS_DIR) if _device_number(n) is not None}
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
        errors = _uncorrected(reader, base, True, problems)
        if problems:
            return None  # a counter went bad: let the full scan report it
        devices.append(dev if errors == dev.uncorrected_errors else replace(dev, uncorrected_errors=errors))
    return replace(inventory, devices=tuple(devices))


def read_ultraserver(reader: _Reader, problems: list[str]) -> UltraServerIds | None:
    """The class-level UltraServer attributes; None outside an UltraServer, when the driver has none of them, or
    when one is malformed (a problem naming the file)."""
    paths = {name: f"{CLASS_DIR}/{name}" for name in us_facts.CLASS_ATTRIBUTES}
    if not any(reader.exists(p) for p in paths.values()):
        return None  # a driver without UltraServer support
    found: list[str] = []
    texts = {name: reader.text(p, found) for name, p in paths.items()}
    values: dict[str, int | str] = {}
    for name in ("node_id_2", "node_id_4"):
        text = texts[name]
        if text is not None:
            try:
                values[name] = parse_int(text, paths[name], minimum=-1,
                                         maximum=1 if name == "node_id_2" else us_facts.NODES_PER_ULTRASERVER - 1)
            except HostValueError as exc:
                found.append(str(exc))
    for name in ("server_id_2", "server_id_4"):
        text = texts[name]
        if text is not None:
            body = text.strip()
            if len(body) != us_facts.SERVER_ID_DIGITS or not re.fullmatch(r"[0-9a-f]+", body):
                found.append(f"{paths[name]}: expected {us_facts.SERVER_ID_DIGITS} lower-case hex digits, "
                             f"got {_show(text)}")
            else:
                values[name] = body
    modes: tuple[int, ...] = ()
    mode_text = (texts["ultraserver_mode"] or "").strip()
    busy = mode_text == us_facts.BUSY
    if mode_text and not busy:
        parts = [p.strip() for p in mode_text.split(",")]
        parsed = [parse_index(p) for p in parts]
        if any(v not in us_facts.RUNTIME_MODES for v in parsed):
            found.append(f"{paths['ultraserver_mode']}: expected 'busy' or a comma list of modes "
                         f"{', '.join(map(str, us_facts.ALL_RUNTIME_MODES))}, got {_show(mode_text)}")
        else:
            modes = tuple(sorted({v for v in parsed if v is not None}))
    if found:
        problems.extend(f"{p}; UltraServer ids unknown" for p in found)
        return None
    node_ids = (values.get("node_id_2"), values.get("node_id_4"))
    outside = us_facts.NO_NODE_ID in node_ids
    if outside:
        if node_ids != (us_facts.NO_NODE_ID, us_facts.NO_NODE_ID) or modes:
            problems.append(f"{CLASS_DIR}: node_id_2/node_id_4/ultraserver_mode disagree about UltraServer membership "
                            f"(node ids {node_ids}, modes {list(modes) or mode_text!r}); UltraServer ids unknown")
        return None
    if us_facts.NO_SERVER_ID in (values["server_id_2"], values["server_id_4"]):
        problems.append(f"{CLASS_DIR}: node ids {node_ids} but a server id is {us_facts.NO_SERVER_ID}; "
                        "UltraServer ids unknown")
        return None
    return UltraServerIds(server_id_2=str(values["server_id_2"]), node_id_2=int(values["node_id_2"]),
                          server_id_4=str(values["server_id_4"]), node_id_4=int(values["node_id_4"]),
                          modes=modes, busy=busy)


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
