"""The EFA (and other RDMA) share of a fake host: ``/sys/class/infiniband*``, the PCI functions,
``/dev/infiniband``, and the GPUs an EFA sits near; mutations: remove/restore a device, port state, counters; the
``--no-efa`` build flag and the ``port`` fault verb. Registered by ``efa_plugin/accelerator.py``. Dev-only: no daemon
imports it. Layout: docs/fake-sysfs.md."""

from __future__ import annotations

import argparse
import hashlib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from accel_core.awsfacts.catalog import InstanceType, PciFunction
from accel_core.fakehost import layout, verbs
from accel_core.fakehost.fsops import FakeHostError
from accel_core.fakehost.host import FakeHost
from accel_core.fakehost.parts import CliOption, Host, HostPart, Writer
from efa_plugin.facts import efa_count, efa_spec, gpu_count, gpu_spec, other_rdma

NVIDIA_VENDOR = "0x10de"
UVERBS_MAJOR = 231
UVERBS_BASE_MINOR = 192  # ib_uverbs minors start at 192: uverbs0 is 231:192
EFA_VENDOR = "0x1d0f"

EFA_DEVICE_COUNTERS = (
    "submitted_cmds", "completed_cmds", "cmds_err", "no_completion_cmds", "keep_alive_rcvd", "alloc_pd_err",
    "create_qp_err", "create_cq_err", "reg_mr_err", "alloc_ucontext_err", "create_ah_err", "mmap_err",
)
EFA_PORT_COUNTERS = (
    "tx_bytes", "tx_pkts", "rx_bytes", "rx_pkts", "rx_drops", "send_bytes", "send_wrs", "recv_bytes", "recv_wrs",
    "rdma_read_wrs", "rdma_read_bytes", "rdma_read_wr_err", "rdma_read_resp_bytes", "rdma_write_wrs",
    "rdma_write_bytes", "rdma_write_wr_err", "rdma_write_recv_bytes", "retrans_bytes", "retrans_pkts",
    "retrans_timeout_events", "unresponsive_remote_events", "impaired_remote_conn_events",
)

_PORT_STATES = {
    "DOWN": ("1: DOWN", "3: Disabled"),
    "INIT": ("2: INIT", "5: LinkUp"),
    "ARMED": ("3: ARMED", "5: LinkUp"),
    "ACTIVE": ("4: ACTIVE", "5: LinkUp"),
}
#: ``fake-sysfs port`` state words -> the sysfs state the part writes (``up`` is ACTIVE)
PORT_WORDS = {"down": "DOWN", "up": "ACTIVE", "active": "ACTIVE", "init": "INIT", "armed": "ARMED"}


@dataclass(frozen=True)
class RdmaSlot:
    """One RDMA device as built: name, PCI function, uverbs index, PCI driver and whether it is an EFA."""

    ibdev: str
    pci: PciFunction
    uverbs: int
    driver: str
    is_efa: bool

    @property
    def pci_dir(self) -> str:
        return layout.pci_dir(self.pci)

    @property
    def ibdev_dir(self) -> str:
        return f"{self.pci_dir}/infiniband/{self.ibdev}"

    @property
    def uverbs_name(self) -> str:
        return f"uverbs{self.uverbs}"

    def group(self) -> list[str]:
        """Paths that vanish when the device is detached, in removal order (entry points first)."""
        return [f"sys/class/infiniband/{self.ibdev}", f"sys/class/infiniband_verbs/{self.uverbs_name}",
                f"dev/infiniband/{self.uverbs_name}", f"sys/bus/pci/drivers/{self.driver}/{self.pci.bdf}",
                f"sys/bus/pci/devices/{self.pci.bdf}", self.pci_dir]


def rdma_slots(spec: InstanceType, *, efa: bool) -> list[RdmaSlot]:
    """RDMA devices in uverbs order: non-EFA (mlx5) first, as the kernel probes them, then the EFAs."""
    slots = [RdmaSlot(d.ibdev, d.pci, i, d.driver, False) for i, d in enumerate(other_rdma(spec))]
    efas = efa_spec(spec)
    if efa and efas is not None:
        start = len(slots)
        slots += [RdmaSlot(d.ibdev, d.pci, start + i, "efa", True) for i, d in enumerate(efas.devices)]
    return slots


def _guid(*parts: str) -> str:
    h = hashlib.sha256("/".join(parts).encode()).hexdigest()[:16]
    return ":".join(h[i : i + 4] for i in range(0, 16, 4))


class EfaPart(HostPart):
    """EFA and non-EFA RDMA devices, and GPUs. Option ``efa=False`` leaves EFA unattached (non-EFA RDMA stays)."""

    options: ClassVar[Mapping[str, Any]] = {"efa": True}
    cli_options: ClassVar[tuple[CliOption, ...]] = (
        CliOption("--no-efa", "efa", {"action": "store_false", "help": "build the type with no EFA attached"}),)
    example = "rdmap79s0 (EFA)"
    columns = ("EFA", "OTHER-RDMA", "GPUS")

    def __init__(self, host: Host, spec: InstanceType, options: Mapping[str, Any]) -> None:
        super().__init__(host, spec, options)
        self._rdma = {s.ibdev: s for s in rdma_slots(spec, efa=bool(self.opts["efa"]))}

    @classmethod
    def row(cls, spec: InstanceType) -> tuple[str, ...]:
        return str(efa_count(spec)), str(len(other_rdma(spec))), str(gpu_count(spec))

    def summary(self) -> list[str]:
        efas = len(self.efa_ibdevs)
        return [f"{efas} EFA", f"{len(self._rdma) - efas} other RDMA", f"{gpu_count(self.spec)} GPU"]

    @classmethod
    def add_verbs(cls, sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
        port = sub.add_parser("port", help="set an EFA/RDMA port down or up (the EFA health rule: a port not ACTIVE "
                              "makes the device Unhealthy, reason PortDown)",
                              description="Set a port's state and phys_state, as a link going down or up would.")
        verbs.dir_and_device(port)
        port.add_argument("state", choices=list(PORT_WORDS), help="down (1: DOWN), up (4: ACTIVE), init or armed")
        port.add_argument("--port", type=int, default=1, metavar="N", help="port number (default 1)")
        port.set_defaults(run=_port_verb)

    def write(self, w: Writer) -> None:
        if self._rdma:
            w.file("sys/class/infiniband_verbs/abi_version", "6\n")
            w.file("dev/infiniband/rdma_cm", "")
        for slot in self._rdma.values():
            self._write_slot(w, slot)
        gpus = gpu_spec(self.spec)
        if gpus is not None:
            for gpu in gpus.devices:
                w.pci_function(gpu.pci, vendor=NVIDIA_VENDOR, device=gpus.pci_device_id, pci_class="0x030200",
                               driver="nvidia")

    def _write_slot(self, w: Writer, slot: RdmaSlot) -> None:
        spec, efas = self.spec, efa_spec(self.spec)
        if slot.is_efa:
            assert efas is not None
            vendor, device, pci_class = EFA_VENDOR, efas.pci_device_id, "0x020000"
            node_type, link_layer, rate = "7: unspecified", "Unknown", efas.rate
        else:
            other = next(d for d in other_rdma(spec) if d.ibdev == slot.ibdev)
            vendor, device, pci_class = other.vendor, other.device, "0x020700"
            node_type, link_layer, rate = other.node_type, other.link_layer, other.rate
        pci = w.pci_function(slot.pci, vendor=vendor, device=device, pci_class=pci_class, driver=slot.driver)
        if slot.is_efa and efas is not None:
            w.file(f"{pci}/p2p", f"{efas.p2p}\n")
        guid = _guid(spec.name, slot.pci.bdf)
        ib = slot.ibdev_dir
        w.files(ib, {"node_type": f"{node_type}\n", "node_guid": f"{guid}\n", "sys_image_guid": f"{guid}\n",
                     "node_desc": f"{slot.ibdev}\n", "fw_ver": "0.0.0.0\n", "hw_rev": "0x0\n"})
        w.link(f"{ib}/device", pci)
        port = f"{ib}/ports/1"
        w.files(port, {"state": "4: ACTIVE\n", "phys_state": "5: LinkUp\n", "rate": f"{rate}\n",
                       "link_layer": f"{link_layer}\n", "lid": "0x0\n", "sm_lid": "0x0\n",
                       "gids/0": f"fe80:0000:0000:0000:{guid}\n"})
        if slot.is_efa:
            w.files(f"{ib}/hw_counters", {**{n: "0\n" for n in EFA_DEVICE_COUNTERS}, "lifespan": "10\n"})
            w.files(f"{port}/hw_counters", {**{n: "0\n" for n in EFA_PORT_COUNTERS}, "lifespan": "10\n"})
        uverbs = f"{pci}/infiniband_verbs/{slot.uverbs_name}"
        w.files(uverbs, {"ibdev": f"{slot.ibdev}\n", "dev": f"{UVERBS_MAJOR}:{UVERBS_BASE_MINOR + slot.uverbs}\n",
                         "abi_version": "1\n"})
        w.link(f"{uverbs}/device", pci)
        w.link(f"sys/class/infiniband/{slot.ibdev}", ib)
        w.link(f"sys/class/infiniband_verbs/{slot.uverbs_name}", uverbs)
        w.file(f"dev/infiniband/{slot.uverbs_name}", "")

    # -- mutations and views (FakeHost offers them by name) ------------------------------------------------------

    @property
    def efa_ibdevs(self) -> list[str]:
        """EFA ibdev names as built (removals do not change this list), in uverbs order."""
        return [s.ibdev for s in self._rdma.values() if s.is_efa]

    @property
    def rdma_ibdevs(self) -> list[str]:
        """All RDMA ibdev names as built, EFA and non-EFA, in uverbs order."""
        return list(self._rdma)

    def uverbs_of(self, ibdev: str) -> str:
        """``uverbsN`` of an RDMA device as built."""
        return self._slot(ibdev).uverbs_name

    def ibdev_dir(self, ibdev: str) -> Path:
        """The device's real sysfs directory (under its PCI function)."""
        return Path(self.host.root) / self._slot(ibdev).ibdev_dir

    def remove_efa(self, ibdev: str) -> None:
        """Detach an EFA/RDMA device: its class links, ``/dev/infiniband/uverbsN``, bus links and PCI function."""
        self.host.remove(f"efa:{ibdev}", self._slot(ibdev).group())

    def restore_efa(self, ibdev: str) -> None:
        """Re-create exactly what :meth:`remove_efa` removed."""
        self._slot(ibdev)
        self.host.restore(f"efa:{ibdev}")

    def set_port_state(self, ibdev: str, state: str, port: int = 1) -> None:
        """Set ``ports/<port>/state`` and ``phys_state``: DOWN, INIT, ARMED or ACTIVE."""
        try:
            logical, physical = _PORT_STATES[state.upper()]
        except KeyError:
            raise FakeHostError(f"port state must be one of {', '.join(_PORT_STATES)}, got {state!r}") from None
        rel = self._port_rel(ibdev, port)
        self.host.replace(f"{rel}/state", f"{logical}\n")
        self.host.replace(f"{rel}/phys_state", f"{physical}\n")

    def port_numbers(self, ibdev: str) -> list[int]:
        """The device's port numbers as the tree has them now (empty while the device is removed)."""
        ports = Path(self.host.root) / self._slot(ibdev).ibdev_dir / "ports"
        return sorted(int(p.name) for p in ports.iterdir() if p.name.isdigit()) if ports.is_dir() else []

    def port_state(self, ibdev: str, port: int = 1) -> str:
        """The port's logical state as sysfs words it, e.g. ``ACTIVE`` (from ``4: ACTIVE``)."""
        text = (Path(self.host.root) / self._port_rel(ibdev, port) / "state").read_text(encoding="utf-8")
        return text.split(":", 1)[-1].strip()

    # -- devices by name (FakeHost.remove_device / restore_device, the fake-sysfs verbs)

    def device_names(self) -> list[str]:
        return self.rdma_ibdevs

    def device_kind(self, name: str) -> str:
        return "EFA" if self._slot(name).is_efa else "RDMA"

    def removal_key(self, name: str) -> str:
        self._slot(name)
        return f"efa:{name}"

    def remove_device(self, name: str) -> None:
        self.remove_efa(name)

    def restore_device(self, name: str) -> None:
        self.restore_efa(name)

    def dev_node(self, name: str) -> str:
        return f"/dev/infiniband/{self.uverbs_of(name)}"

    def device_state(self, name: str) -> str:
        return ", ".join(f"port {n} {self.port_state(name, n)}" for n in self.port_numbers(name))

    def set_efa_counter(self, ibdev: str, name: str, value: int, port: int | None = None) -> None:
        """Set a ``hw_counters`` value: device scope when ``port`` is None, else ``ports/<port>/hw_counters``."""
        base = self._slot(ibdev).ibdev_dir
        rel = f"{base}/hw_counters/{name}" if port is None else f"{base}/ports/{port}/hw_counters/{name}"
        self.host.replace(rel, f"{int(value)}\n", what=f"counter {name!r} of {ibdev}")

    def _port_rel(self, ibdev: str, port: int) -> str:
        slot = self._slot(ibdev)
        known = self.port_numbers(ibdev)
        if port not in known:
            have = f"ports: {', '.join(map(str, known))}" if known else "it is removed"
            raise self.fail(f"{ibdev} has no port {port} ({have})")
        return f"{slot.ibdev_dir}/ports/{port}"

    def _slot(self, ibdev: str) -> RdmaSlot:
        try:
            return self._rdma[ibdev]
        except KeyError:
            known = ", ".join(self._rdma) or "none"
            raise self.fail(f"no RDMA device {ibdev!r} (built: {known})") from None


def _port_verb(host: FakeHost, args: argparse.Namespace) -> str:
    part = host.part_of(args.device)
    if not isinstance(part, EfaPart):
        raise FakeHostError(f"{args.device} is a {part.device_kind(args.device)} device and has no ports; "
                            f"ports belong to RDMA devices ({verbs.names_with(host, 'port_state')})")
    verbs.present(host, args.device)
    before = part.port_state(args.device, args.port)
    part.set_port_state(args.device, PORT_WORDS[args.state], args.port)
    return f"{args.device} port {args.port}: {before} -> {part.port_state(args.device, args.port)}"
