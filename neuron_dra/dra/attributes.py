"""What the driver publishes for each Neuron device: ResourceSlice attributes and health taints.

One device per Neuron device (chip), named ``neuron-device-<i>``. Unqualified attribute names belong to the
driver's domain (CEL ``device.attributes['neuron.aws.com'].deviceId``):

- ``deviceId`` (int), ``instanceType``, ``neuronDriverVersion`` (when known), ``draDriverVersion`` (version),
  ``resourceType`` = ``neuron_device``, ``deviceName`` (``Trainium2``), ``numaNode`` (int, when known);
- on the 4x4 torus: ``topology_x`` (row), ``topology_y`` (column), ``topology4_id`` (row id, ``i // 4``),
  ``topology8_id`` (two-row id, ``i // 8``);
- on EFA-enabled instance types: ``resource.aws.com/devicegroup{1,4,8,16}_id``
  (see :mod:`accel_core.awsfacts.neuron_efa`);
- ``resource.kubernetes.io/pcieRoot`` and ``resource.kubernetes.io/pciBusID`` when the PCI function is known, and
  ``resource.kubernetes.io/numaNode`` (int) when sysfs gives a NUMA node (none for ``numa_node`` -1);
- from the Node's labels, added by the core (:mod:`accel_core.dra.nodelabels`, :data:`NODE_LABEL_ATTRIBUTES`):
  ``networkNodeLayer1..3`` and ``capacityBlockId``.

No capacity: AWS's attribute reference names none, and a per-device capacity costs kube-scheduler CPU on every
candidate device of every pod (docs/benchmarks.md, "Fleet scale").
An unhealthy device keeps its entry and gets the taint ``neuron.aws.com/unhealthy=<Reason>:NoSchedule``.
"""

from __future__ import annotations

from accel_core.awsfacts.neuron_efa import neuron_device_group_ids
from accel_core.dra.nodelabels import AWS_TOPOLOGY_LABELS
from accel_core.dra.profile import unhealthy_taint_key
from accel_core.dra.slicemodel import AttributeValue, SliceDevice, Version
from accel_core.hostfiles import parse_index
from neuron_dra import DEVICE_PREFIX, DRA_DRIVER_NAME
from neuron_dra.discovery import NeuronDevice, NeuronInventory

RESOURCE_TYPE = "neuron_device"
UNHEALTHY_TAINT_KEY = unhealthy_taint_key(DRA_DRIVER_NAME)
PCIE_ROOT = "resource.kubernetes.io/pcieRoot"
PCI_BUS_ID = "resource.kubernetes.io/pciBusID"
NUMA_NODE = "resource.kubernetes.io/numaNode"
#: Node labels the devices carry as attributes (the profile's ``Scan.node_label_attributes``).
NODE_LABEL_ATTRIBUTES = AWS_TOPOLOGY_LABELS


def device_name(index: int) -> str:
    return f"{DEVICE_PREFIX}{index}"


def device_index(name: str) -> int | None:
    """``neuron-device-3`` -> 3; None for any other name (ASCII digits only: ``neuron-device-²`` is not one)."""
    return parse_index(name, DEVICE_PREFIX)


def device_attributes(inv: NeuronInventory, dev: NeuronDevice, dra_version: str) -> dict[str, AttributeValue]:
    attrs: dict[str, AttributeValue] = {
        "deviceId": dev.index,
        "resourceType": RESOURCE_TYPE,
        "draDriverVersion": Version(dra_version),
    }
    if inv.instance_type:
        attrs["instanceType"] = inv.instance_type
    if inv.driver_version:
        attrs["neuronDriverVersion"] = inv.driver_version
    if dev.device_name:
        attrs["deviceName"] = dev.device_name
    if dev.numa_node is not None and dev.numa_node >= 0:
        attrs["numaNode"] = dev.numa_node
        attrs[NUMA_NODE] = dev.numa_node
    topo = inv.topology
    if topo.kind == "torus4x4" and 0 <= dev.index < topo.device_count:
        x, y = topo.coordinates(dev.index)
        attrs["topology_x"] = x
        attrs["topology_y"] = y
        attrs["topology4_id"] = topo.group_id(dev.index, 4)
        attrs["topology8_id"] = topo.group_id(dev.index, 8)
    attrs.update(neuron_device_group_ids(inv.instance_type, dev.index))
    if dev.pcie_root:
        attrs[PCIE_ROOT] = dev.pcie_root
    if dev.pci_address:
        attrs[PCI_BUS_ID] = dev.pci_address
    return attrs


def slice_devices(inv: NeuronInventory, dra_version: str) -> list[SliceDevice]:
    """The pool's devices in index order (the service taints unhealthy ones: :func:`accel_core.dra.profile.tainted`)."""
    return [SliceDevice(device_name(dev.index), device_attributes(inv, dev, dra_version)) for dev in inv.devices]
