"""Generate a host tree (``/sys``, ``/dev``, ``/proc``, ``/opt``) for a catalog instance type under a root.

``build_host(root, "trn2.48xlarge")`` writes the real Linux layout the EFA and Neuron discovery code reads on a
node, then returns a :class:`~accel_core.fakehost.host.FakeHost` for mutations. Layout: docs/fake-sysfs.md.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import uuid
from pathlib import Path

from accel_core.awsfacts import catalog, ultraserver
from accel_core.awsfacts.catalog import InstanceType, NeuronSpec, PciFunction
from accel_core.awsfacts.ultraserver import UltraServerIds
from accel_core.fakehost import layout
from accel_core.fakehost.fsops import FakeHostError, link, write_plain
from accel_core.fakehost.host import MARKER, FakeHost

#: Top-level entries the builder owns; ``clear_host`` removes exactly these.
MANAGED_TOP_LEVEL = ("sys", "dev", "proc", "opt", MARKER)

_EFA_VENDOR = "0x1d0f"
_NVIDIA_VENDOR = "0x10de"
_POWER_TIMESTAMP = 1767225600  # assumed: fixed so trees are reproducible


def default_boot_id(instance_type: str) -> str:
    """A fixed UUID per instance type (the same type always gets the same boot id)."""
    return str(uuid.uuid5(uuid.NAMESPACE_URL, f"fake-sysfs:{instance_type}"))


def _hex_id(*parts: str, length: int = 16) -> str:
    return hashlib.sha256("/".join(parts).encode()).hexdigest()[:length]


def _guid(*parts: str) -> str:
    h = _hex_id(*parts)
    return ":".join(h[i : i + 4] for i in range(0, 16, 4))


class _Writer:
    """Writes files and relative links under one root while the tree is being built."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def file(self, rel: str, text: str) -> None:
        write_plain(self.root / rel, text)

    def files(self, rel_dir: str, values: dict[str, str]) -> None:
        for name, text in values.items():
            self.file(f"{rel_dir}/{name}", text)

    def link(self, rel: str, target_rel: str) -> None:
        link(self.root / rel, self.root / target_rel)

    def pci_function(self, fn: PciFunction, *, vendor: str, device: str, pci_class: str, driver: str) -> str:
        """The PCI function dir with its identity files, driver link and ``/sys/bus/pci`` links."""
        rel = layout.pci_dir(fn)
        if fn.bus != fn.root_bus:
            bridge = f"sys/devices/{fn.root}/{layout.bridge_bdf(fn)}"
            if not (self.root / bridge).exists():
                self.files(
                    bridge, {"class": "0x060400\n", "vendor": f"{_EFA_VENDOR}\n", "numa_node": f"{fn.numa_node}\n"}
                )
        self.files(
            rel,
            {
                "vendor": f"{vendor}\n",
                "device": f"{device}\n",
                "subsystem_vendor": f"{vendor}\n",
                "subsystem_device": f"{device}\n",
                "class": f"{pci_class}\n",
                "numa_node": f"{fn.numa_node}\n",
            },
        )
        driver_dir = f"sys/bus/pci/drivers/{driver}"
        self.link(f"{rel}/driver", driver_dir)
        self.link(f"{driver_dir}/{fn.bdf}", rel)
        self.link(f"sys/bus/pci/devices/{fn.bdf}", rel)
        return rel


def _write_rdma(w: _Writer, spec: InstanceType, slot: layout.RdmaSlot) -> None:
    if slot.is_efa:
        assert spec.efa is not None
        vendor, device, pci_class = _EFA_VENDOR, spec.efa.pci_device_id, "0x020000"
        node_type, link_layer, rate = "7: unspecified", "Unknown", spec.efa.rate
    else:
        other = next(d for d in spec.other_rdma if d.ibdev == slot.ibdev)
        vendor, device, pci_class = other.vendor, other.device, "0x020700"
        node_type, link_layer, rate = other.node_type, other.link_layer, other.rate
    pci = w.pci_function(slot.pci, vendor=vendor, device=device, pci_class=pci_class, driver=slot.driver)
    if slot.is_efa and spec.efa is not None:
        w.file(f"{pci}/p2p", f"{spec.efa.p2p}\n")
    guid = _guid(spec.name, slot.pci.bdf)
    ib = slot.ibdev_dir
    w.files(
        ib,
        {
            "node_type": f"{node_type}\n",
            "node_guid": f"{guid}\n",
            "sys_image_guid": f"{guid}\n",
            "node_desc": f"{slot.ibdev}\n",
            "fw_ver": "0.0.0.0\n",
            "hw_rev": "0x0\n",
        },
    )
    w.link(f"{ib}/device", pci)
    port = f"{ib}/ports/1"
    w.files(
        port,
        {
            "state": "4: ACTIVE\n",
            "phys_state": "5: LinkUp\n",
            "rate": f"{rate}\n",
            "link_layer": f"{link_layer}\n",
            "lid": "0x0\n",
            "sm_lid": "0x0\n",
            "gids/0": f"fe80:0000:0000:0000:{guid}\n",
        },
    )
    if slot.is_efa:
        w.files(f"{ib}/hw_counters", {**{n: "0\n" for n in layout.EFA_DEVICE_COUNTERS}, "lifespan": "10\n"})
        w.files(f"{port}/hw_counters", {**{n: "0\n" for n in layout.EFA_PORT_COUNTERS}, "lifespan": "10\n"})
    uverbs = f"{pci}/infiniband_verbs/{slot.uverbs_name}"
    w.files(
        uverbs,
        {
            "ibdev": f"{slot.ibdev}\n",
            "dev": f"{layout.UVERBS_MAJOR}:{layout.UVERBS_BASE_MINOR + slot.uverbs}\n",
            "abi_version": "1\n",
        },
    )
    w.link(f"{uverbs}/device", pci)
    w.link(f"sys/class/infiniband/{slot.ibdev}", ib)
    w.link(f"sys/class/infiniband_verbs/{slot.uverbs_name}", uverbs)
    w.file(f"dev/infiniband/{slot.uverbs_name}", "")


def _counter(values: tuple[str, ...], *, peak: bool = False) -> dict[str, str]:
    files = ("total", "present", "peak") if peak else ("total", "present")
    return {f"{name}/{f}": "0\n" for name in values for f in files}


def _write_neuron(w: _Writer, spec: InstanceType, neuron: NeuronSpec, slot: layout.NeuronSlot) -> None:
    w.pci_function(slot.pci, vendor=_EFA_VENDOR, device=neuron.pci_device_id, pci_class="0x088000", driver=slot.driver)
    dev = neuron.devices[slot.index]
    d = slot.sysfs_dir
    w.files(
        d,
        {
            "dev": f"{layout.NEURON_MAJOR}:{slot.index}\n",
            "uevent": f"MAJOR={layout.NEURON_MAJOR}\nMINOR={slot.index}\nDEVNAME=neuron{slot.index}\n",
            "core_count": str(neuron.cores_per_device),
            "connected_devices": ", ".join(str(c) for c in dev.connected) + "\n",
            "reset": "",
            "info/notify_delay": "-1\n",
            "info/serial_number": f"{_hex_id(spec.name, 'neuron', str(slot.index))}\n",
            "info/architecture/arch_type": f"{neuron.arch_type}\n",
            "info/architecture/device_name": f"{neuron.device_name}\n",
            "info/architecture/instance_type": f"{neuron.arch_instance_type}\n",
            "stats/power/utilization": f"POWER_STATUS_VALID,{_POWER_TIMESTAMP},0.00,0.00,0.00\n",
        },
    )
    w.files(f"{d}/stats/hardware", _counter(layout.NEURON_HW_COUNTERS))
    w.files(f"{d}/stats/memory_usage/host_mem", _counter(layout.NEURON_HOST_MEM_CATEGORIES, peak=True))
    for core in range(neuron.cores_per_device):
        c = f"{d}/neuron_core{core}"
        w.file(f"{c}/info/architecture/arch_type", f"{neuron.core_arch_type}\n")
        w.files(f"{c}/stats/status", _counter(layout.NEURON_STATUS_COUNTERS))
        w.files(f"{c}/stats/memory_usage/device_mem", _counter(layout.NEURON_DEVICE_MEM_CATEGORIES, peak=True))
        w.files(f"{c}/stats/memory_usage/host_mem", {"total": "0\n", "present": "0\n", "peak": "0\n"})
        w.files(f"{c}/stats/other_info", {name: "0\n" for name in layout.NEURON_OTHER_INFO})
    w.link(f"sys/class/neuron_device/neuron{slot.index}", d)
    w.file(f"dev/neuron{slot.index}", "")


def _write_neuron_class(w: _Writer, neuron: NeuronSpec, ids: UltraServerIds | None) -> None:
    """Class-level UltraServer attributes: one node's ids, or the values of a node outside an UltraServer."""
    w.files("sys/class/neuron_device", ultraserver.class_files(ids))
    w.file("sys/module/neuron/version", f"{neuron.driver_version}\n")


def build_host(root: Path, instance_type: str, *, efa: bool = True, lnc: int | None = None,
               ultraserver_id: str | None = None, ultraserver_node: int | None = None) -> FakeHost:
    """Write the host tree of ``instance_type`` under ``root`` and return a handle for mutations.

    ``efa=False`` leaves EFA unattached (no EFA PCI functions or ``infiniband`` entries; non-EFA RDMA stays).
    ``lnc`` writes ``/opt/aws/neuron/logical_nc_config``; only types with an LNC setting (trn2) accept it.
    ``ultraserver_id`` and ``ultraserver_node`` (0..3) make the node one of a 4-node UltraServer (types whose
    catalog entry says ``ultraserver``, i.e. trn2u); without them the node stands alone.
    Raises :class:`~accel_core.awsfacts.catalog.UnknownInstanceType` or :class:`FakeHostError`.
    """
    spec = catalog.get(instance_type)
    ids = _ultraserver_ids(spec, ultraserver_id, ultraserver_node)
    if lnc is not None:
        if not spec.supports_lnc:
            raise FakeHostError(f"instance type {instance_type} has no Logical NeuronCore setting; --lnc not allowed")
        if lnc not in (1, 2):
            raise FakeHostError(f"LNC must be 1 or 2, got {lnc}")
    root = Path(root)
    existing = [name for name in MANAGED_TOP_LEVEL if (root / name).exists() or (root / name).is_symlink()]
    if existing:
        raise FakeHostError(f"{root} already holds a host tree ({', '.join(existing)}); clear it first")
    root.mkdir(parents=True, exist_ok=True)
    w = _Writer(root)

    w.files(
        "sys/devices/virtual/dmi/id",
        {
            "product_name": f"{spec.name}\n",
            "sys_vendor": "Amazon EC2\n",
            "board_asset_tag": f"i-{_hex_id(spec.name, 'instance', length=17)}\n",
        },
    )
    w.link("sys/class/dmi/id", "sys/devices/virtual/dmi/id")
    w.file("proc/sys/kernel/random/boot_id", f"{default_boot_id(spec.name)}\n")
    if lnc is not None:
        w.file("opt/aws/neuron/logical_nc_config", f"NEURON_LOGICAL_NC_CONFIG={lnc}\n")

    slots = layout.rdma_slots(spec, efa=efa)
    if slots:
        w.file("sys/class/infiniband_verbs/abi_version", "6\n")
        w.file("dev/infiniband/rdma_cm", "")
    for slot in slots:
        _write_rdma(w, spec, slot)
    if spec.gpus is not None:
        for gpu in spec.gpus.devices:
            w.pci_function(
                gpu.pci, vendor=_NVIDIA_VENDOR, device=spec.gpus.pci_device_id, pci_class="0x030200", driver="nvidia"
            )
    if spec.neuron is not None:
        _write_neuron_class(w, spec.neuron, ids)
        for nslot in layout.neuron_slots(spec):
            _write_neuron(w, spec, spec.neuron, nslot)

    w.file(MARKER, json.dumps({"instance_type": spec.name, "efa": efa, "lnc": lnc, "ultraserver": ultraserver_id,
                               "ultraserver_node": ultraserver_node}) + "\n")
    return FakeHost(root, spec, efa=efa)


def _ultraserver_ids(spec: InstanceType, name: str | None, node: int | None) -> UltraServerIds | None:
    if name is None and node is None:
        return None
    if name is None or node is None:
        raise FakeHostError("an UltraServer node needs both an UltraServer id and a node number (0..3)")
    if spec.neuron is None or not spec.neuron.ultraserver:
        raise FakeHostError(f"instance type {spec.name} is not an UltraServer node type (trn2u.48xlarge is)")
    if not name or not name.isascii() or not name.isprintable():
        raise FakeHostError(f"UltraServer id must be printable ASCII, got {name!r}")
    try:
        return ultraserver.fake_ids(name, node)
    except ValueError as exc:
        raise FakeHostError(str(exc)) from None


def clear_host(root: Path) -> None:
    """Remove what :func:`build_host` wrote under ``root`` (only its top-level entries; nothing else)."""
    root = Path(root)
    if root.resolve() == Path("/"):
        raise FakeHostError("refusing to clear the real root /")
    for name in MANAGED_TOP_LEVEL:
        path = root / name
        if path.is_symlink() or path.is_file():
            path.unlink()
        elif path.is_dir():
            shutil.rmtree(path)
