"""Read the host's EFA devices into frozen records: pure reads under a host root, no policy, no Kubernetes.

The walk follows the kernel's own links and never the names: every ``/sys/class/infiniband_verbs/uverbsN`` names
its RDMA device in ``ibdev``; ``/sys/class/infiniband/<ibdev>/device`` is the PCI function. A device is an EFA when
that function's driver is ``efa`` or its IDs are vendor 0x1d0f / device 0xefa0-0xefaf; everything else (the mlx5
``ibp*`` devices of p6-b200, say) is listed as ignored. Netdevs are never consulted: efa-only interfaces have none.

Nothing here raises for a bad host file. An entry that cannot be identified becomes a *skipped* problem naming the
path; a device that is identified but degraded (port not ACTIVE, device node missing, malformed ``numa_node``)
carries *problems* that make it Unhealthy, each a typed :class:`~accel_core.health.Problem` whose kind the one
EFA health rule (:mod:`efa_plugin.health_rule`) reads.
"""

from __future__ import annotations

import os
import re
import stat
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

from accel_core.health import Problem, ProblemKind
from accel_core.hostfiles import (
    HostValueError,
    is_missing,
    parse_index,
    parse_int,
    printable,
    read_attr,
    read_hex,
    read_int,
    read_label,
)
from accel_core.hostinfo import pcie_root, read_instance_type
from accel_core.paths import HostPaths
from efa_plugin.neuron_map import neuron_table
from efa_plugin.presence import CLASS_IB as CLASS_IB
from efa_plugin.presence import EFA_DRIVER

EFA_VENDOR = 0x1D0F
EFA_DEVICE_IDS = range(0xEFA0, 0xEFB0)
NVIDIA_VENDOR = 0x10DE
MAX_ID_LENGTH = 63

CLASS_VERBS = "/sys/class/infiniband_verbs"
DEV_IB = "/dev/infiniband"
PCI_DEVICES = "/sys/bus/pci/devices"

MAX_PORT = 255  #: port numbers are u8 in the kernel
MAX_NUMA_NODE = 4095
MAX_MAJOR = 4095  #: 12-bit major, 20-bit minor (MINORBITS)
MAX_MINOR = 2**20 - 1

_BDF_RE = re.compile(r"^[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]$", re.ASCII)


@dataclass(frozen=True)
class EfaDevice:
    """One EFA RDMA device as the host shows it. ``problems`` empty means Healthy."""

    id: str  #: stable ID advertised to the kubelet: the PCI address (the ibdev name if there is none)
    ibdev: str  #: RDMA device name, e.g. ``rdmap79s0`` or ``efa_0``
    uverbs: str  #: ``uverbsN`` (changes across hosts and hot-plug; never an identity)
    device_node: str  #: ``/dev/infiniband/uverbsN`` as seen on the node (not under the host root)
    major: int | None
    minor: int | None
    pci_address: str
    pcie_root: str | None  #: ``pci0000:44``: the first component below /sys/devices
    numa_node: int | None  #: None when the kernel reports -1 or the file is unusable
    port_states: tuple[tuple[int, str], ...]  #: (port, state) e.g. ((1, "ACTIVE"),)
    sysfs_dir: Path  #: resolved ``.../infiniband/<ibdev>`` directory (hw_counters live below it)
    near_gpus: tuple[str, ...] = ()  #: PCI addresses of NVIDIA GPUs on the same PCIe root
    near_neurons: tuple[int, ...] = ()  #: Neuron device indices this EFA serves (trn mapping tables)
    problems: tuple[str, ...] = ()  #: why it is Unhealthy; each names the path it comes from
    link_layer: str | None = None  #: ``ports/1/link_layer`` (``Unknown`` on EFA)
    firmware_version: str | None = None  #: ``fw_ver``, when sysfs has it

    @property
    def healthy(self) -> bool:
        return not self.problems

    @property
    def port_state(self) -> str | None:
        """State of the first port (EFA has exactly one)."""
        return self.port_states[0][1] if self.port_states else None

    def as_dict(self) -> dict[str, object]:
        """JSON-friendly view for ``ls --output json``."""
        return {
            "id": self.id,
            "ibdev": self.ibdev,
            "uverbs": self.uverbs,
            "device_node": self.device_node,
            "major_minor": f"{self.major}:{self.minor}" if self.major is not None else None,
            "pci_address": self.pci_address,
            "pcie_root": self.pcie_root,
            "numa_node": self.numa_node,
            "port_state": self.port_state,
            "healthy": self.healthy,
            "problems": list(self.problems),
            "near_gpus": list(self.near_gpus),
            "near_neurons": list(self.near_neurons),
        }


@dataclass(frozen=True)
class IgnoredRdma:
    """An RDMA device that is not an EFA (kept for ``ls`` so people see why it is not counted)."""

    ibdev: str
    uverbs: str
    pci_address: str
    reason: str


@dataclass(frozen=True)
class EfaInventory:
    """Everything one discovery pass found; deterministic for the same host."""

    devices: tuple[EfaDevice, ...] = ()
    ignored: tuple[IgnoredRdma, ...] = ()
    skipped: tuple[str, ...] = ()  #: entries that could not be identified, each naming its path
    instance_type: str | None = None

    @cached_property
    def by_id(self) -> dict[str, EfaDevice]:
        return {d.id: d for d in self.devices}

    def get(self, device_id: str) -> EfaDevice | None:
        return self.by_id.get(device_id)


# ------------------------------------------------------------------------------------------------ small readers


def _label_or_none(path: str) -> str | None:
    """A short printable value (it may become a ResourceSlice attribute), or None when absent or not one."""
    try:
        return read_label(path)
    except HostValueError:
        return None


def _hex_or_none(path: str) -> int | None:
    try:
        return read_hex(path)
    except HostValueError:
        return None


# ------------------------------------------------------------------------------------------------ discovery


def discover(paths: HostPaths) -> EfaInventory:
    """Walk ``infiniband_verbs`` under the host root and return the EFA inventory (never raises for host files)."""
    instance_type = read_instance_type(paths)
    try:
        entries = {e: n for e in os.listdir(paths.host(CLASS_VERBS))
                   if (n := parse_index(e, "uverbs")) is not None}
    except FileNotFoundError:  # no RDMA device at all (c5, EFA not attached)
        entries = {}
    except OSError as exc:
        return EfaInventory(skipped=(f"{CLASS_VERBS}: cannot list ({_why(exc)})",), instance_type=instance_type)
    context = _Context(paths, instance_type)
    devices: dict[str, EfaDevice] = {}
    ignored: list[IgnoredRdma] = []
    skipped: list[str] = []
    for uverbs in sorted(entries, key=entries.__getitem__):
        result = context.read_uverbs(uverbs)
        if isinstance(result, IgnoredRdma):
            ignored.append(result)
        elif isinstance(result, str):
            skipped.append(result)
        elif result.id in devices:  # two uverbs entries for one device: keep the first, say so
            skipped.append(f"{CLASS_VERBS}/{uverbs}: same device {result.id} as {devices[result.id].uverbs}; skipped")
        else:
            devices[result.id] = result
    ordered = tuple(sorted(devices.values(), key=lambda d: d.id))
    return EfaInventory(ordered, tuple(ignored), tuple(skipped), instance_type)


class _Context:
    """Per-pass state: paths, the Neuron table and the GPU-per-root index (built lazily, once per pass).

    Hot path (a rescan runs every second): string paths, one readlink instead of a realpath where possible.
    """

    def __init__(self, paths: HostPaths, instance_type: str | None) -> None:
        self.paths = paths
        self.neurons = neuron_table(instance_type)
        self.root = str(paths.host_root).rstrip("/")
        self._gpus_by_root: dict[str, list[str]] | None = None

    def read_uverbs(self, uverbs: str) -> EfaDevice | IgnoredRdma | str:
        """One ``uverbsN`` entry -> an EFA, an ignored non-EFA, or a problem string naming the path."""
        shown = f"{CLASS_VERBS}/{uverbs}"
        verbs_path = self.root + shown
        try:
            ibdev = read_attr(f"{verbs_path}/ibdev", f"{shown}/ibdev")
        except HostValueError as exc:
            return f"{exc}; entry skipped"
        if not ibdev or len(ibdev) > MAX_ID_LENGTH or not ibdev.isascii() or not ibdev.isprintable() \
                or "/" in ibdev or ibdev in (".", ".."):
            return f"{shown}/ibdev: invalid RDMA device name {ibdev!r}; entry skipped"
        class_link = f"{self.root}{CLASS_IB}/{ibdev}"
        ib_dir = _resolve(class_link)
        if ib_dir is None or not os.path.isdir(ib_dir):
            state = "a dangling link" if os.path.islink(class_link) else "missing"
            return f"{shown}: RDMA device {ibdev!r} has no {CLASS_IB}/{ibdev} ({state}); entry skipped"
        pci_dir = _resolve(f"{ib_dir}/device")
        if pci_dir is None or not os.path.isdir(pci_dir):
            state = "a dangling link" if os.path.islink(f"{ib_dir}/device") else "missing"
            return f"{CLASS_IB}/{ibdev}/device: {state}; cannot find the PCI function; entry skipped"
        pci_address = printable(os.path.basename(pci_dir))
        reason = _not_efa_reason(pci_dir)
        if reason is not None:
            return IgnoredRdma(ibdev, uverbs, pci_address, reason)
        return self._efa(uverbs, verbs_path, ibdev, ib_dir, pci_dir, pcie_root(self.paths, pci_dir))

    @staticmethod
    def _root_of_link(bus_link: str) -> str | None:
        """``pci0000:44`` from a ``/sys/bus/pci/devices/<bdf>`` link target (``../../../devices/pci0000:44/...``)."""
        try:
            parts = os.readlink(bus_link).split("/")
        except OSError:
            return None
        for before, part in zip(parts, parts[1:], strict=False):
            if before == "devices" and part.startswith("pci"):
                return part
        return None

    def _efa(self, uverbs: str, verbs_path: str, ibdev: str, ib_dir: str, pci_dir: str,
             root: str | None) -> EfaDevice:
        problems: list[str] = []
        pci_address = printable(os.path.basename(pci_dir))
        device_id = pci_address if _BDF_RE.match(pci_address) else ibdev
        device_id = device_id[:MAX_ID_LENGTH]

        numa_node: int | None = None
        numa_file = f"{pci_dir}/numa_node"
        try:
            numa_node = read_int(numa_file, self._shown(numa_file), minimum=-1, maximum=MAX_NUMA_NODE)
        except HostValueError as exc:
            if not is_missing(exc):
                problems.append(Problem(str(exc), ProblemKind.BAD_HOST_FILE))
        if numa_node is not None and numa_node < 0:
            numa_node = None

        major, minor, dev_problem = _major_minor(f"{verbs_path}/dev", f"{CLASS_VERBS}/{uverbs}/dev")
        if dev_problem:
            problems.append(dev_problem)

        device_node = f"{DEV_IB}/{uverbs}"
        problem = _device_node_problem(self.root + device_node, device_node, major, minor)
        if problem:
            problems.append(problem)

        port_states, port_problems = _ports(ib_dir, ibdev)
        problems += port_problems
        return EfaDevice(
            id=device_id,
            ibdev=ibdev,
            uverbs=uverbs,
            device_node=device_node,
            major=major,
            minor=minor,
            pci_address=pci_address,
            pcie_root=root,
            numa_node=numa_node,
            port_states=port_states,
            sysfs_dir=Path(ib_dir),
            near_gpus=tuple(self._gpus_on(root)) if root else (),
            near_neurons=self.neurons.get(pci_address, ()),
            problems=tuple(problems),
            link_layer=_label_or_none(f"{ib_dir}/ports/{port_states[0][0]}/link_layer") if port_states else None,
            firmware_version=_label_or_none(f"{ib_dir}/fw_ver") or None,
        )

    def _shown(self, path: str) -> str:
        """The node's own path (``/sys/...``) for a path under the host root."""
        return printable(path[len(self.root):] if self.root and path.startswith(self.root + "/") else path)

    def _gpus_on(self, root: str) -> list[str]:
        if self._gpus_by_root is None:
            self._gpus_by_root = self._index_gpus()
        return self._gpus_by_root.get(root, [])

    def _index_gpus(self) -> dict[str, list[str]]:
        """NVIDIA display/3D controllers per PCIe root, from the ``/sys/bus/pci/devices`` links."""
        out: dict[str, list[str]] = {}
        base = self.root + PCI_DEVICES
        try:
            names = sorted(os.listdir(base))
        except OSError:
            return out
        for name in names:
            link = f"{base}/{name}"
            if _hex_or_none(f"{link}/vendor") != NVIDIA_VENDOR:
                continue
            pci_class = _hex_or_none(f"{link}/class")
            root = self._root_of_link(link)
            if root is not None and pci_class is not None and pci_class >> 16 == 0x03:
                out.setdefault(root, []).append(name)
        return out


def _resolve(path: str) -> str | None:
    """Resolve a sysfs symlink with one readlink: sysfs links are relative and point into real directories, so
    joining the target onto the link's (already resolved) parent is exact. Falls back to realpath otherwise."""
    try:
        target = os.readlink(path)
    except FileNotFoundError:
        return None
    except OSError:  # not a link: a real directory (or something the caller rejects)
        return os.path.realpath(path) if os.path.exists(path) else None
    if os.path.isabs(target):
        return os.path.realpath(path)
    return os.path.normpath(os.path.join(os.path.dirname(path), target))


def _why(exc: BaseException) -> str:
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror
    return type(exc).__name__


def _not_efa_reason(pci_dir: str) -> str | None:
    """None for an EFA; otherwise a short reason (driver and IDs) for listing it as ignored."""
    try:
        driver: str | None = printable(os.path.basename(os.readlink(f"{pci_dir}/driver")))
    except OSError:
        driver = None
    if driver == EFA_DRIVER:
        return None
    vendor = _hex_or_none(f"{pci_dir}/vendor")
    device = _hex_or_none(f"{pci_dir}/device")
    if vendor == EFA_VENDOR and device in EFA_DEVICE_IDS:
        return None
    ids = f"{vendor:#06x}:{device:#06x}" if vendor is not None and device is not None else "unknown IDs"
    return f"not an EFA (driver {driver or 'none'}, PCI {ids})"


def _major_minor(path: str, shown: str) -> tuple[int | None, int | None, Problem | None]:
    """(major, minor, problem) from a ``dev`` attribute (``231:192``); a missing file is no problem."""
    try:
        text = read_attr(path, shown)
    except HostValueError as exc:
        return None, None, None if is_missing(exc) else Problem(str(exc), ProblemKind.BAD_HOST_FILE)
    major_text, sep, minor_text = text.partition(":")
    try:
        if not sep:
            raise HostValueError(f"{shown}: expected major:minor, got {text[:40]!r}")
        return (parse_int(major_text, f"{shown} (major)", maximum=MAX_MAJOR),
                parse_int(minor_text, f"{shown} (minor)", maximum=MAX_MINOR), None)
    except HostValueError as exc:
        return None, None, Problem(str(exc), ProblemKind.BAD_HOST_FILE)


def _device_node_problem(host_path: str, node: str, major: int | None, minor: int | None) -> Problem | None:
    try:
        st = os.stat(host_path)
    except FileNotFoundError:
        return Problem(f"{node}: device node missing", ProblemKind.DEV_NODE_MISSING)
    except OSError as exc:
        return Problem(f"{node}: {_why(exc)}", ProblemKind.DEV_NODE_MISSING)
    if stat.S_ISCHR(st.st_mode) and major is not None:
        actual = (os.major(st.st_rdev), os.minor(st.st_rdev))
        if actual != (major, minor):
            return Problem(f"{node}: device node is {actual[0]}:{actual[1]} but sysfs says {major}:{minor}",
                           ProblemKind.DEV_NODE_MISSING)
    return None


def _ports(ib_dir: str, ibdev: str) -> tuple[tuple[tuple[int, str], ...], list[str]]:
    """Every port's logical state; a port that is not ACTIVE or unreadable is a problem."""
    shown = f"{CLASS_IB}/{ibdev}/ports"
    try:
        ports = sorted(n for p in os.listdir(f"{ib_dir}/ports") if (n := parse_index(p, maximum=MAX_PORT)) is not None)
    except OSError as exc:
        return (), [Problem(f"{shown}: cannot list ports ({_why(exc)})", ProblemKind.BAD_HOST_FILE)]
    if not ports:
        return (), [Problem(f"{shown}: no ports", ProblemKind.LINK_DOWN)]
    states: list[tuple[int, str]] = []
    problems: list[str] = []
    for port in ports:
        try:
            text = read_attr(f"{ib_dir}/ports/{port}/state", f"{shown}/{port}/state")
        except HostValueError as exc:
            problems.append(Problem(str(exc), ProblemKind.BAD_HOST_FILE))
            continue
        if not text.isprintable() or len(text) > 64:
            problems.append(Problem(f"{shown}/{port}/state: not a port state ({text[:40]!r})",
                                    ProblemKind.BAD_HOST_FILE))
            continue
        state = text.split(":", 1)[-1].strip() or text  # "4: ACTIVE" -> "ACTIVE"
        states.append((port, state))
        if state != "ACTIVE":
            problems.append(Problem(f"{shown}/{port}/state: port is {state}, not ACTIVE", ProblemKind.LINK_DOWN))
    return tuple(states), problems
