"""Where each device of a catalog instance type lives in the generated tree (paths relative to the host root).

The builder writes these paths and the mutation API removes and restores them, so both agree by construction.
See docs/fake-sysfs.md for the same layout in prose.
"""

from __future__ import annotations

from dataclasses import dataclass

from accel_core.awsfacts.catalog import InstanceType, PciFunction

UVERBS_MAJOR = 231
UVERBS_BASE_MINOR = 192  # ib_uverbs minors start at 192: uverbs0 is 231:192
NEURON_MAJOR = 241  # assumed: the Neuron driver allocates its major dynamically

EFA_DEVICE_COUNTERS = (
    "submitted_cmds",
    "completed_cmds",
    "cmds_err",
    "no_completion_cmds",
    "keep_alive_rcvd",
    "alloc_pd_err",
    "create_qp_err",
    "create_cq_err",
    "reg_mr_err",
    "alloc_ucontext_err",
    "create_ah_err",
    "mmap_err",
)
EFA_PORT_COUNTERS = (
    "tx_bytes",
    "tx_pkts",
    "rx_bytes",
    "rx_pkts",
    "rx_drops",
    "send_bytes",
    "send_wrs",
    "recv_bytes",
    "recv_wrs",
    "rdma_read_wrs",
    "rdma_read_bytes",
    "rdma_read_wr_err",
    "rdma_read_resp_bytes",
    "rdma_write_wrs",
    "rdma_write_bytes",
    "rdma_write_wr_err",
    "rdma_write_recv_bytes",
    "retrans_bytes",
    "retrans_pkts",
    "retrans_timeout_events",
    "unresponsive_remote_events",
    "impaired_remote_conn_events",
)
NEURON_STATUS_COUNTERS = (
    "success",
    "failure",
    "timeout",
    "exec_bad_input",
    "hw_error",
    "infer_failed_to_queue",
    "resource_nc_error",
    "unsupported_neff_version",
    "infer_completed_with_error",
    "invalid_error",
    "oob_error",
    "generic_error",
    "infer_completed_with_num_error",
    "resource_error",
    "hw_hbm_ue_error",
    "hw_nc_ue_error",
    "hw_dma_abort_error",
    "hw_collectives_error",
)
NEURON_DEVICE_MEM_CATEGORIES = (
    "collectives",
    "constants",
    "dma_rings",
    "driver_memory",
    "model_code",
    "model_shared_scratchpad",
    "nonshared_scratchpad",
    "notifications",
    "runtime_memory",
    "tensors",
    "uncategorized",
)
NEURON_HOST_MEM_CATEGORIES = (
    "application_memory",
    "constants",
    "dma_buffers",
    "dma_rings",
    "driver_memory",
    "notifications",
    "tensors",
    "uncategorized",
)
NEURON_HW_COUNTERS = ("mem_ecc_uncorrected", "mem_ecc_repairable_uncorrected", "sram_ecc_uncorrected")
NEURON_OTHER_INFO = (
    "flop_count",
    "inference_count",
    "model_load_count",
    "reset_fail_count",
    "reset_req_count",
    "nc_time_in_use",
)


def pci_dir(fn: PciFunction) -> str:
    """``sys/devices/pci0000:XX/[0000:XX:01.0/]<bdf>``: directly on the root bus or behind one bridge."""
    base = f"sys/devices/{fn.root}"
    if fn.bus == fn.root_bus:
        return f"{base}/{fn.bdf}"
    return f"{base}/{bridge_bdf(fn)}/{fn.bdf}"


def bridge_bdf(fn: PciFunction) -> str:
    """The single bridge placed between a root and the devices on other buses (its ``01.0`` function)."""
    return f"{fn.bdf[:4]}:{fn.root_bus:02x}:01.0"


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
        return pci_dir(self.pci)

    @property
    def ibdev_dir(self) -> str:
        return f"{self.pci_dir}/infiniband/{self.ibdev}"

    @property
    def uverbs_name(self) -> str:
        return f"uverbs{self.uverbs}"

    def group(self) -> list[str]:
        """Paths that vanish when the device is detached, in removal order (entry points first)."""
        return [
            f"sys/class/infiniband/{self.ibdev}",
            f"sys/class/infiniband_verbs/{self.uverbs_name}",
            f"dev/infiniband/{self.uverbs_name}",
            f"sys/bus/pci/drivers/{self.driver}/{self.pci.bdf}",
            f"sys/bus/pci/devices/{self.pci.bdf}",
            self.pci_dir,
        ]


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
        return [
            f"sys/class/neuron_device/neuron{self.index}",
            f"dev/neuron{self.index}",
            self.sysfs_dir,
            f"sys/bus/pci/drivers/{self.driver}/{self.pci.bdf}",
            f"sys/bus/pci/devices/{self.pci.bdf}",
            pci_dir(self.pci),
        ]


def rdma_slots(spec: InstanceType, *, efa: bool) -> list[RdmaSlot]:
    """RDMA devices in uverbs order: non-EFA (mlx5) first, as the kernel probes them, then the EFAs."""
    slots = [RdmaSlot(d.ibdev, d.pci, i, d.driver, False) for i, d in enumerate(spec.other_rdma)]
    if efa and spec.efa is not None:
        start = len(slots)
        slots += [RdmaSlot(d.ibdev, d.pci, start + i, "efa", True) for i, d in enumerate(spec.efa.devices)]
    return slots


def neuron_slots(spec: InstanceType) -> list[NeuronSlot]:
    if spec.neuron is None:
        return []
    return [NeuronSlot(d.index, d.pci, spec.neuron.pci_driver) for d in spec.neuron.devices]
