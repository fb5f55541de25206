"""The Neuron devices of a node as discovery found them: :class:`NeuronDevice` (one chip) and the frozen
:class:`NeuronInventory` (every device plus node-wide settings), with the core counts derived from them."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from neuron_dra.coreids import logical_cores
from neuron_dra.facts import arch as neuron_facts
from neuron_dra.facts.ultraserver import UltraServerIds
from neuron_dra.topology import Topology


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
        return logical_cores(physical, self.lnc) if physical > 0 else 0

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
