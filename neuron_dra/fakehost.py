"""The Neuron share of a fake host: ``/sys/class/neuron_device``, ``/dev/neuronN``, the PCI functions, the LNC
file and the UltraServer class attributes; mutations: remove/restore a device, counters, UltraServer ids; the
``--lnc`` and ``--ultraserver`` build flags and the ``neuron-error`` fault verb. Registered by
``neuron_dra/accelerator.py``. Dev-only: no daemon imports it. Layout: docs/fake-sysfs.md."""

from __future__ import annotations

import argparse
import hashlib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from accel_core.awsfacts.catalog import InstanceType, PciFunction
from accel_core.fakehost import layout, verbs
from accel_core.fakehost.fsops import FakeHostError, resolve
from accel_core.fakehost.host import FakeHost
from accel_core.fakehost.parts import CliOption, Host, HostPart, Writer
from neuron_dra.driver_sysfs import LNC_FILE, LNC_KEY, NEURON_PCI_VENDOR
from neuron_dra.facts import ultraserver
from neuron_dra.facts.catalog import neuron_spec, supports_lnc
from neuron_dra.facts.ultraserver import UltraServerIds

NEURON_MAJOR = 241  # assumed: the Neuron driver allocates its major dynamically
_POWER_TIMESTAMP = 1767225600  # assumed: fixed so trees are reproducible

NEURON_STATUS_COUNTERS = (
    "success", "failure", "timeout", "exec_bad_input", "hw_error", "infer_failed_to_queue", "resource_nc_error",
    "unsupported_neff_version", "infer_completed_with_error", "invalid_error", "oob_error", "generic_error",
    "infer_completed_with_num_error", "resource_error", "hw_hbm_ue_error", "hw_nc_ue_error", "hw_dma_abort_error",
    "hw_collectives_error",
)
NEURON_DEVICE_MEM_CATEGORIES = (
    "collectives", "constants", "dma_rings", "driver_memory", "model_code", "model_shared_scratchpad",
    "nonshared_scratchpad", "notifications", "runtime_memory", "tensors", "uncategorized",
)
NEURON_HOST_MEM_CATEGORIES = (
    "application_memory", "constants", "dma_buffers", "dma_rings", "driver_memory", "notifications", "tensors",
    "uncategorized",
)
NEURON_HW_COUNTERS = ("mem_ecc_uncorrected", "mem_ecc_repairable_uncorrected", "sram_ecc_uncorrected")
NEURON_OTHER_INFO = ("flop_count", "inference_count", "model_load_count", "reset_fail_count", "reset_req_count",
                     "nc_time_in_use")


@dataclass(frozen=True)
class NeuronSlot:
    index: int
    pci: PciFunction
    driver: str

    @property
    def sysfs_dir(self) -> str:
        return f"sys/devices/virtual/neuron_device/neuron{self.index}"

    def group(self) -> list[str]:
        """Paths that vanish when the device disappears, in removal order (entry points first)."""
        return [f"sys/class/neuron_device/neuron{self.index}", f"dev/neuron{self.index}", self.sysfs_dir,
                f"sys/bus/pci/drivers/{self.driver}/{self.pci.bdf}", f"sys/bus/pci/devices/{self.pci.bdf}",
                layout.pci_dir(self.pci)]


def neuron_slots(spec: InstanceType) -> list[NeuronSlot]:
    neuron = neuron_spec(spec)
    return [NeuronSlot(d.index, d.pci, neuron.pci_driver) for d in neuron.devices] if neuron else []


def _counter(values: tuple[str, ...], *, peak: bool = False) -> dict[str, str]:
    files = ("total", "present", "peak") if peak else ("total", "present")
    return {f"{name}/{f}": "0\n" for name in values for f in files}


class NeuronPart(HostPart):
    """Neuron devices. Options: ``lnc`` (1 or 2, types with an LNC setting), ``ultraserver_id`` and
    ``ultraserver_node`` (0..3; UltraServer node types) make the node one of a 4-node UltraServer."""

    options: ClassVar[Mapping[str, Any]] = {"lnc": None, "ultraserver_id": None, "ultraserver_node": None}
    cli_options: ClassVar[tuple[CliOption, ...]] = (
        CliOption("--lnc", "lnc", {"type": int, "choices": (1, 2),
                                   "help": "write /opt/aws/neuron/logical_nc_config (trn2 only)"}),
        CliOption("--ultraserver", "ultraserver_id", {
            "metavar": "ID",
            "help": "make the node part of the 4-node UltraServer ID (trn2u.48xlarge; needs --ultraserver-node)"},
            cluster_wide=False),
        CliOption("--ultraserver-node", "ultraserver_node", {
            "type": int, "choices": range(4), "metavar": "K", "help": "this node's number (0..3) in the UltraServer"},
            cluster_wide=False),
    )
    example = "neuron3 (Neuron)"
    columns = ("NEURON", "LNC")

    def __init__(self, host: Host, spec: InstanceType, options: Mapping[str, Any]) -> None:
        super().__init__(host, spec, options)
        self._neuron = {s.index: s for s in neuron_slots(spec)}

    @classmethod
    def check(cls, spec: InstanceType, options: Mapping[str, Any]) -> None:
        lnc = options.get("lnc")
        if lnc is not None:
            if not supports_lnc(spec):
                raise FakeHostError(f"instance type {spec.name} has no Logical NeuronCore setting; --lnc is not "
                                    "allowed")
            if lnc not in (1, 2):
                raise FakeHostError(f"LNC must be 1 or 2, got {lnc}")
        _ultraserver_ids(spec, options.get("ultraserver_id"), options.get("ultraserver_node"))

    @classmethod
    def applies(cls, spec: InstanceType, option: str) -> bool:
        return option != "lnc" or supports_lnc(spec)

    @classmethod
    def row(cls, spec: InstanceType) -> tuple[str, ...]:
        neuron = neuron_spec(spec)
        return _cell(spec), str(neuron.lnc_default) if neuron and neuron.lnc_default else "-"

    def summary(self) -> list[str]:
        us = self.opts["ultraserver_id"]
        return [f"{_cell(self.spec)} Neuron",
                *([f"UltraServer {us} node {self.opts['ultraserver_node']}"] if us is not None else [])]

    @classmethod
    def add_verbs(cls, sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
        err = sub.add_parser("neuron-error", help="add uncorrected ECC errors to a Neuron device (unhealthy until "
                             "cleared), or --clear them as a driver reload would",
                             description="Add errors to a Neuron device's stats/hardware/<counter> (total and "
                             "present). mem_ecc_uncorrected and sram_ecc_uncorrected make the device unhealthy "
                             "(reason UncorrectedErrors) until they read 0 again; --clear sets every hardware "
                             "counter to 0, as a Neuron driver reload does.")
        verbs.dir_and_device(err, "a Neuron device, e.g. neuron3")
        err.add_argument("--counter", choices=NEURON_HW_COUNTERS, default="mem_ecc_uncorrected",
                         help="which counter (default mem_ecc_uncorrected)")
        group = err.add_mutually_exclusive_group()
        group.add_argument("--count", type=int, metavar="N", help="errors to add (default 1)")
        group.add_argument("--clear", action="store_true", help="set every hardware counter of the device to 0")
        err.set_defaults(run=_neuron_error_verb)

    def write(self, w: Writer) -> None:
        spec, neuron = self.spec, neuron_spec(self.spec)
        if self.opts["lnc"] is not None:
            w.file(LNC_FILE.lstrip("/"), f"{LNC_KEY}={self.opts['lnc']}\n")
        if neuron is None:
            return
        ids = _ultraserver_ids(spec, self.opts["ultraserver_id"], self.opts["ultraserver_node"])
        w.files("sys/class/neuron_device", ultraserver.class_files(ids))
        w.file("sys/module/neuron/version", f"{neuron.driver_version}\n")
        for slot in self._neuron.values():
            self._write_slot(w, slot)

    def _write_slot(self, w: Writer, slot: NeuronSlot) -> None:
        spec, neuron = self.spec, neuron_spec(self.spec)
        assert neuron is not None
        w.pci_function(slot.pci, vendor=NEURON_PCI_VENDOR, device=neuron.pci_device_id, pci_class="0x088000",
                       driver=slot.driver)
        dev = neuron.devices[slot.index]
        d = slot.sysfs_dir
        serial = hashlib.sha256(f"{spec.name}/neuron/{slot.index}".encode()).hexdigest()[:16]
        w.files(d, {
            "dev": f"{NEURON_MAJOR}:{slot.index}\n",
            "uevent": f"MAJOR={NEURON_MAJOR}\nMINOR={slot.index}\nDEVNAME=neuron{slot.index}\n",
            "core_count": str(neuron.cores_per_device),
            "connected_devices": ", ".join(str(c) for c in dev.connected) + "\n",
            "reset": "",
            "info/notify_delay": "-1\n",
            "info/serial_number": f"{serial}\n",
            "info/architecture/arch_type": f"{neuron.arch_type}\n",
            "info/architecture/device_name": f"{neuron.device_name}\n",
            "info/architecture/instance_type": f"{neuron.arch_instance_type}\n",
            "stats/power/utilization": f"POWER_STATUS_VALID,{_POWER_TIMESTAMP},0.00,0.00,0.00\n",
        })
        w.files(f"{d}/stats/hardware", _counter(NEURON_HW_COUNTERS))
        w.files(f"{d}/stats/memory_usage/host_mem", _counter(NEURON_HOST_MEM_CATEGORIES, peak=True))
        for core in range(neuron.cores_per_device):
            c = f"{d}/neuron_core{core}"
            w.file(f"{c}/info/architecture/arch_type", f"{neuron.core_arch_type}\n")
            w.files(f"{c}/stats/status", _counter(NEURON_STATUS_COUNTERS))
            w.files(f"{c}/stats/memory_usage/device_mem", _counter(NEURON_DEVICE_MEM_CATEGORIES, peak=True))
            w.files(f"{c}/stats/memory_usage/host_mem", {"total": "0\n", "present": "0\n", "peak": "0\n"})
            w.files(f"{c}/stats/other_info", {name: "0\n" for name in NEURON_OTHER_INFO})
        w.link(f"sys/class/neuron_device/neuron{slot.index}", d)
        w.file(f"dev/neuron{slot.index}", "")

    # -- mutations and views (FakeHost offers them by name) ------------------------------------------------------

    @property
    def neuron_count(self) -> int:
        """Neuron devices as built (removals do not change this number)."""
        return len(self._neuron)

    def remove_neuron(self, index: int) -> None:
        """Remove Neuron device ``index``: class link, ``/dev/neuronN``, its sysfs dir and its PCI function."""
        self.host.remove(f"neuron:{index}", self._nslot(index).group())

    def restore_neuron(self, index: int) -> None:
        """Re-create exactly what :meth:`remove_neuron` removed."""
        self._nslot(index)
        self.host.restore(f"neuron:{index}")

    def set_neuron_counter(self, index: int, relpath: str, value: int | str) -> None:
        """Set a file below ``neuronN/``, e.g. ``neuron_core0/stats/status/hw_error/total`` or
        ``stats/hardware/mem_ecc_uncorrected/total``. The file must exist."""
        rel = f"{self._nslot(index).sysfs_dir}/{relpath.strip('/')}"
        resolve(self.host.root, rel)
        self.host.replace(rel, f"{value}\n", what=f"neuron{index} attribute {relpath!r}")

    def hw_errors(self, index: int) -> dict[str, int]:
        """The device's ``stats/hardware/<counter>/total`` values (the Neuron health rule reads the uncorrected
        ones: a device with any is unhealthy)."""
        base = Path(self.host.root) / self._nslot(index).sysfs_dir / "stats/hardware"
        return {name: _int_or_zero(base / name / "total") for name in NEURON_HW_COUNTERS}

    def add_hw_errors(self, index: int, counter: str = "mem_ecc_uncorrected", count: int = 1) -> int:
        """Add ``count`` errors to a ``stats/hardware`` counter (``total`` and ``present``, as the driver counts
        them) and return the new total. Counters are those of :data:`NEURON_HW_COUNTERS`."""
        if counter not in NEURON_HW_COUNTERS:
            raise self.fail(f"no Neuron hardware counter {counter!r} (known: {', '.join(NEURON_HW_COUNTERS)})")
        if count < 1:
            raise self.fail(f"an error count must be at least 1, got {count}")
        total = self.hw_errors(index)[counter] + count
        rel = f"stats/hardware/{counter}"
        present = _int_or_zero(Path(self.host.root) / self._nslot(index).sysfs_dir / rel / "present")
        self.set_neuron_counter(index, f"{rel}/present", present + count)
        self.set_neuron_counter(index, f"{rel}/total", total)
        return total

    def clear_hw_errors(self, index: int) -> None:
        """Every ``stats/hardware`` counter back to 0, as after a Neuron driver reload."""
        for name in NEURON_HW_COUNTERS:
            for f in ("present", "total"):
                self.set_neuron_counter(index, f"stats/hardware/{name}/{f}", 0)

    # -- devices by name (FakeHost.remove_device / restore_device, the fake-sysfs verbs)

    def device_names(self) -> list[str]:
        return [f"neuron{i}" for i in self._neuron]

    def device_kind(self, name: str) -> str:
        return "Neuron"

    def removal_key(self, name: str) -> str:
        return f"neuron:{self.index_of(name)}"

    def remove_device(self, name: str) -> None:
        self.remove_neuron(self.index_of(name))

    def restore_device(self, name: str) -> None:
        self.restore_neuron(self.index_of(name))

    def dev_node(self, name: str) -> str:
        return f"/dev/neuron{self.index_of(name)}"

    def device_state(self, name: str) -> str:
        index = self.index_of(name)
        if not (Path(self.host.root) / self._nslot(index).sysfs_dir).is_dir():
            return ""
        errors = ", ".join(f"{k}={v}" for k, v in self.hw_errors(index).items() if v)
        return f"hw errors: {errors or 'none'}"

    def index_of(self, name: str) -> int:
        """``neuron3`` -> 3, for a device this host has."""
        digits = name.removeprefix("neuron")
        if name.startswith("neuron") and digits.isascii() and digits.isdigit() and int(digits) in self._neuron:
            return int(digits)
        raise self.fail(f"no Neuron device {name!r} (built: neuron0..neuron{len(self._neuron) - 1})"
                        if self._neuron else f"no Neuron device {name!r} (it has none)")

    def set_ultraserver(self, ids: UltraServerIds | None) -> None:
        """Rewrite the class-level UltraServer attributes: a node's ids (``busy=True`` writes ``busy`` as the
        mode, as during an election), or None for the values of a node outside an UltraServer."""
        for name, text in ultraserver.class_files(ids).items():
            self.host.replace(f"sys/class/neuron_device/{name}", text, what=f"neuron class attribute {name}")

    def _nslot(self, index: int) -> NeuronSlot:
        try:
            return self._neuron[index]
        except KeyError:
            raise self.fail(f"no Neuron device {index} (built: {len(self._neuron)} devices)") from None


def _int_or_zero(path: Path) -> int:
    """A counter file's value; 0 when it is missing or not a number (a test may have corrupted it)."""
    try:
        return int(path.read_text(encoding="utf-8").strip())
    except (OSError, ValueError):
        return 0


def _ultraserver_ids(spec: InstanceType, name: str | None, node: int | None) -> UltraServerIds | None:
    if name is None and node is None:
        return None
    if name is None or node is None:
        raise FakeHostError("an UltraServer node needs both an UltraServer id and a node number (0..3): "
                            "--ultraserver ID and --ultraserver-node K go together")
    neuron = neuron_spec(spec)
    if neuron is None or not neuron.ultraserver:
        raise FakeHostError(f"instance type {spec.name} is not an UltraServer node type (trn2u.48xlarge is)")
    if not name or not name.isascii() or not name.isprintable():
        raise FakeHostError(f"UltraServer id must be printable ASCII, got {name!r}")
    try:
        return ultraserver.fake_ids(name, node)
    except ValueError as exc:
        raise FakeHostError(str(exc)) from None


def _cell(spec: InstanceType) -> str:
    """``16x8``: Neuron devices x NeuronCores each, ``-`` for none."""
    neuron = neuron_spec(spec)
    return f"{len(neuron.devices)}x{neuron.cores_per_device}" if neuron and neuron.devices else "-"


def _neuron_error_verb(host: FakeHost, args: argparse.Namespace) -> str:
    part = host.part_of(args.device)
    if not isinstance(part, NeuronPart):
        raise FakeHostError(f"{args.device} is not a Neuron device ({verbs.names_with(host, 'add_hw_errors')})")
    verbs.present(host, args.device)
    index = part.index_of(args.device)
    if args.clear:
        part.clear_hw_errors(index)
        return f"{args.device}: every stats/hardware counter is 0 (as after a Neuron driver reload)"
    count = 1 if args.count is None else args.count
    total = part.add_hw_errors(index, args.counter, count)
    return f"{args.device}: stats/hardware/{args.counter}/total = {total} (+{count})"
