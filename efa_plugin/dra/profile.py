"""The EFA DRA driver ``efa.aws.com`` as a profile of the generic DRA core (:mod:`accel_core.dra`).

- devices: one per EFA, named ``efa-<PCI address>`` with ``:`` and ``.`` as ``-`` (``efa-0000-4f-00-0``): a
  DNS label that stays the same across reboots (the ``uverbsN`` index and even the ibdev name may not);
- attributes (unqualified names are the driver's domain, CEL ``device.attributes['efa.aws.com'].rdmaDevice``):
  ``pciAddress``, ``rdmaDevice`` (ibdev), ``uverbs``, ``numaNode`` (when known), ``instanceType``, ``linkLayer``,
  ``portState``, ``firmwareVersion`` (when sysfs has it), ``draDriverVersion``, plus
  ``resource.kubernetes.io/pcieRoot``, ``resource.kubernetes.io/pciBusID`` and ``resource.kubernetes.io/numaNode``
  (int, none for ``numa_node`` -1), ``networkNodeLayer1..3`` and ``capacityBlockId`` from the Node's labels
  (:mod:`accel_core.dra.nodelabels`), and on the instance types the AWS
  Neuron-to-EFA tables cover, ``resource.aws.com/devicegroup{1,4,8,16}_id``: the ids of the Neuron device(s) the
  EFA serves, the same values the Neuron driver publishes (:mod:`accel_core.awsfacts.neuron_efa`);
- host side: the EFA host scanner the device plugin uses too (:mod:`efa_plugin.scanner`): the one health rule, a
  device seen earlier that vanishes stays published, tainted ``DeviceMissing``; the ports' ``state`` files are
  the health files the core polls between rescans; the coexistence guard;
- config: ``EfaConfig`` (``apiVersion: efa.aws.com/v1``), strict, no settings yet;
- container edits: the device's ``/dev/infiniband/uverbsN`` per device, and ``/dev/infiniband/rdma_cm`` once per
  request when the host has it;
- nothing is published or prepared while the EFA device plugin runs on the node.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from accel_core.awsfacts.neuron_efa import efa_device_group_ids
from accel_core.dra.config import decode_struct
from accel_core.dra.nodelabels import AWS_TOPOLOGY_LABELS
from accel_core.dra.profile import RequestEdits, Scan
from accel_core.dra.slicemodel import AttributeValue, SliceDevice, Version
from accel_core.dra.types import ClaimError, DeviceStatusData
from accel_core.edits import ContainerEdits, DeviceNode
from accel_core.health import DeviceHealth
from accel_core.paths import HostPaths
from efa_plugin import DRA_DRIVER_NAME
from efa_plugin.discovery import EfaDevice, EfaInventory
from efa_plugin.dra.config import EfaParams
from efa_plugin.dra.names import device_name
from efa_plugin.health_rule import present
from efa_plugin.scanner import RDMA_CM, EfaScanner

API_VERSION = f"{DRA_DRIVER_NAME}/v1"
KIND = "EfaConfig"
PCIE_ROOT = "resource.kubernetes.io/pcieRoot"
PCI_BUS_ID = "resource.kubernetes.io/pciBusID"
NUMA_NODE = "resource.kubernetes.io/numaNode"


@dataclass(frozen=True)
class EfaConfig:
    """The decoded opaque config (``EfaConfig`` has no settings yet; strict decoding still refuses typos)."""


def device_attributes(inv: EfaInventory, dev: EfaDevice, dra_version: str) -> dict[str, AttributeValue]:
    attrs: dict[str, AttributeValue] = {
        "pciAddress": dev.pci_address,
        "rdmaDevice": dev.ibdev,
        "uverbs": dev.uverbs,
        "draDriverVersion": Version(dra_version),
    }
    optional: dict[str, AttributeValue | None] = {
        "numaNode": dev.numa_node, "instanceType": inv.instance_type, "linkLayer": dev.link_layer,
        "portState": dev.port_state, "firmwareVersion": dev.firmware_version, PCIE_ROOT: dev.pcie_root,
        NUMA_NODE: dev.numa_node,
    }
    attrs.update((k, v[:64] if isinstance(v, str) else v) for k, v in optional.items() if v not in (None, ""))
    if dev.pci_address:
        attrs[PCI_BUS_ID] = dev.pci_address
        attrs.update(efa_device_group_ids(inv.instance_type or "", dev.pci_address))
    return attrs


class EfaProfile:
    """:class:`~accel_core.dra.profile.DraProfile` for EFA devices, on the EFA host scanner."""

    driver_name: str = DRA_DRIVER_NAME
    metrics_prefix: str = "efa_dra"
    default_config: EfaConfig = EfaConfig()

    def __init__(self, scanner: EfaScanner | None = None) -> None:
        self.scanner = scanner if scanner is not None else EfaScanner()
        self._rdma_cm = False
        self._health: Mapping[str, DeviceHealth] = {}  # the latest scan's, by device-plugin ID

    def scan(self, paths: HostPaths, dra_version: str) -> Scan[EfaInventory]:
        host = self.scanner.scan(paths)
        inv = host.inventory
        self._rdma_cm = os.path.exists(paths.host(RDMA_CM))
        devices = tuple(SliceDevice(device_name(d), device_attributes(inv, d, dra_version)) for d in inv.devices)
        self._health = host.health
        health = {device_name(d): host.health[d.id] for d in inv.devices}
        return Scan(inv, devices, health, host.problems, host.summary, node_label_attributes=AWS_TOPOLOGY_LABELS)

    def decode_config(self, parameters: object, where: str) -> EfaConfig:
        decode_struct(parameters, where, (EfaParams,))
        return EfaConfig()

    def container_edits(self, inventory: EfaInventory, request: str, devices: Sequence[str],
                        config: EfaConfig) -> RequestEdits:
        """Each device's ``uverbsN`` node (rw, with its major:minor), and ``rdma_cm`` for the request."""
        by_name = {device_name(d): d for d in inventory.devices}
        edits: dict[str, ContainerEdits] = {}
        status: dict[str, DeviceStatusData] = {}
        for name in devices:
            dev = by_name.get(name)
            if dev is None:
                raise ClaimError(f"device {name} (request {request}) is not an EFA of this node "
                                 f"(devices: {', '.join(sorted(by_name)) or 'none'})")
            if not present(dev):
                why = self._health.get(dev.id)
                raise ClaimError(f"device {name} ({dev.ibdev}, request {request}) cannot be used on this node: "
                                 f"{why.message if why is not None else 'not present'}")
            node = DeviceNode(dev.device_node, permissions="rw", major=dev.major, minor=dev.minor)
            edits[name] = ContainerEdits(device_nodes=(node,))
            status[name] = device_status(dev)
        shared = (DeviceNode(RDMA_CM, permissions="rw"),) if self._rdma_cm else ()
        # in the container's device metadata file, beside the published rdmaDevice and uverbs (``uverbsN``)
        metadata = {name: {"uverbsDevice": by_name[name].device_node} for name in edits}
        return RequestEdits(edits, ContainerEdits(device_nodes=shared), status, metadata)


def device_status(dev: EfaDevice) -> DeviceStatusData:
    """The claim's ``status.devices`` data of one EFA: its RDMA device, uverbs node and PCI address. No
    ``networkData``: an EFA is an RDMA device with no network interface of its own (its ENA, when it has one, is
    another PCI function; an efa-only interface has none), so there is no interface name, IP or MAC to report."""
    data: dict[str, object] = {"rdmaDevice": dev.ibdev, "uverbs": dev.device_node, "pciBusID": dev.pci_address}
    if dev.numa_node is not None:
        data["numaNode"] = dev.numa_node
    return DeviceStatusData(data)
