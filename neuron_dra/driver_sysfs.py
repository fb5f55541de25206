"""What the Neuron driver and the host show of each device, read one file at a time.

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
falls back to the instance catalog (or the architecture's defaults). :mod:`neuron_dra.discovery` puts the values
together into the inventory; the UltraServer class attributes are read by :mod:`neuron_dra.ultraserver_sysfs`.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable
from pathlib import Path

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
from neuron_dra.facts import arch as neuron_facts
from neuron_dra.instances import ExpectedLayout
from neuron_dra.presence import CLASS_DIR

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


def device_number(name: str) -> int | None:
    """``neuron3`` -> 3 (ASCII digits only); None for any other entry."""
    return parse_index(name, "neuron", maximum=MAX_DEVICES - 1)


class SysfsReader:
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


def show_value(text: str, limit: int = 40) -> str:
    """A bad value as a problem line shows it: stripped, cut to ``limit``."""
    return describe(text.strip(), limit)


def parse_connected(text: str) -> tuple[int, ...]:
    """``"12, 3, 4, 1\\n"`` -> ``(12, 3, 4, 1)``; an empty line -> ``()``. ValueError for anything else."""
    body = text.strip()
    if not body:
        return ()
    parts = [p for p in re.split(r"[, \t\n]+", body) if p]
    values = tuple(parse_index(p, maximum=MAX_DEVICES - 1) for p in parts)
    if any(v is None for v in values):
        raise ValueError(f"expected comma-separated device indices below {MAX_DEVICES}, got {show_value(text)}")
    if len(set(values)) != len(values):
        raise ValueError(f"device indices repeat in {show_value(text)}")
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
        raise ValueError(f"no {LNC_KEY}=1|2 line in {show_value(text)}")
    if value not in ("1", "2"):
        raise ValueError(f"{LNC_KEY} must be 1 or 2, got {value!r}")
    return int(value)


def read_instance_type_or_note(paths: HostPaths, problems: list[str]) -> str:
    """The EC2 instance type from DMI; "" and a problem when it is missing."""
    found = read_instance_type(paths, problems)
    if found is None:
        problems.append(f"{DMI_PRODUCT_NAMES[0]}: missing or empty; instance type unknown, no catalog fallback")
    return found or ""


def device_indices(reader: SysfsReader, expected: ExpectedLayout | None, known: Iterable[int]) -> list[int]:
    """Every device index the driver, ``/dev``, the catalog or ``known`` names, sorted."""
    found: set[int] = set(known)
    for name in [*reader.listdir(CLASS_DIR), *reader.listdir("/dev")]:
        number = device_number(name)
        if number is not None:
            found.add(number)
    if expected is not None:
        found.update(range(expected.device_count))
    return sorted(found)


def read_arch(reader: SysfsReader, base: str, expected: ExpectedLayout | None, instance_type: str) -> tuple[str, str]:
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


def read_core_count(reader: SysfsReader, base: str, present: bool, problems: list[str]) -> int | None:
    """Physical NeuronCores of the device at ``base``; None (and a problem) when absent or out of range."""
    if not present:
        return None
    path = f"{base}/core_count"
    text = reader.text(path, problems)
    if text is None:
        return None
    try:
        value = parse_int(text, path)
    except HostValueError:
        problems.append(f"{path}: expected a number of NeuronCores, got {show_value(text)}")
        return None
    if not 1 <= value <= MAX_CORES_PER_DEVICE:
        problems.append(f"{path}: {value} NeuronCores is outside 1..{MAX_CORES_PER_DEVICE}")
        return None
    return value


def read_uncorrected(reader: SysfsReader, base: str, present: bool, problems: list[str]) -> int:
    """The sum of the device's :data:`UNCORRECTED_COUNTERS` (a counter may be a directory with ``total``)."""
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


def read_pci(reader: SysfsReader, index: int,
             expected: ExpectedLayout | None) -> tuple[str | None, int | None, str | None]:
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


def read_lnc(reader: SysfsReader, applies: bool, problems: list[str]) -> int | None:
    """The LNC setting where it applies: the file's value, else the default (a problem when malformed)."""
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


