"""NeuronCores as DRA devices (partitionable devices, ``--core-devices on``): each chip's cores as shared counters,
one device per logical NeuronCore consuming them, and the chips consuming all of theirs.

- Counter set ``neuron-device-<i>`` per chip: one counter ``core-<p>`` (value 1) per **physical** core ``p``
  (``core_count``: 8 on Trainium2). Per-core counters, not one ``cores`` total: two devices that share a core
  must exclude each other, which a total would not say. Nothing else is counted: a core's HBM share and DMA rings
  go with the core, so no partition can take one without the other.
- The chip ``neuron-device-<i>`` consumes every counter of its set; core device ``neuron-device-<i>-core-<k>``
  (logical core ``k`` at the node's LNC) consumes the physical cores ``k*LNC .. k*LNC+LNC-1``. kube-scheduler
  allocates a counter once, so a chip with a core taken cannot go to a whole-chip claim, nor a core of a taken chip.
- Only single logical cores are published: 2 or 4 cores of one chip are ``count: 2`` / ``count: 4`` with
  ``matchAttribute: neuron.aws.com/deviceId`` (cores of connected chips: ``devicegroup4_id`` or ``topology4_id``).
  Aligned 2- and 4-core devices as well would more than double the devices (trn2 at LNC 1: 224 core devices per
  node instead of 128), which every claim's selector is evaluated on, and would make an extended-resource count
  (``aws.amazon.com/neuroncore: N``, one device each) mean anything but N cores.
- Core devices carry few attributes, as kube-scheduler turns every attribute of every candidate device into CEL
  values on each evaluation (64 more devices per trn2 node): ``resourceType`` ``neuron_core``, ``deviceId`` (the
  chip: cores of one chip), ``coreIndex`` (``k``), ``logicalNeuronCore`` (the LNC ``k`` is counted at, where LNC
  applies), ``instanceType``, and the chip's EFA groups ``resource.aws.com/devicegroup{1,4,8,16}_id`` (cores of
  connected chips, and of a chip next to an EFA), where the chip has them.
- Coexistence (:class:`CoreDevicesScanner`): a core device is the same hardware as its chip's
  ``aws.amazon.com/neuron`` ID and its own ``aws.amazon.com/neuroncore`` ID, so a chip a device-plugin pod holds
  keeps its cores unpublished too, and a core a DRA claim holds keeps that chip and core from the device plugin.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace

from accel_core.awsfacts.neuron_efa import GROUP_SIZES, attribute_name
from accel_core.dra.slicemodel import AttributeValue, CounterSet, SliceDevice
from accel_core.hostfiles import parse_index
from neuron_dra import DEVICE_PREFIX, DRA_DRIVER_NAME
from neuron_dra.coreids import core_ids
from neuron_dra.discovery import NeuronDevice, NeuronInventory
from neuron_dra.dra.attributes import device_name
from neuron_dra.scanner import CORE_INFIX, core_device_name, logical_cores

RESOURCE_TYPE = "neuron_core"
#: ``--core-devices node-label``: core devices only on Nodes labelled ``neuron.aws.com/core-devices=true`` (a node
#: pool opts in), through the driver's Node watch (:mod:`accel_core.dra.nodelabels`), which also gives every device
#: of such a node the attribute ``coreDevices`` = ``true``.
NODE_LABEL = f"{DRA_DRIVER_NAME}/core-devices"
GATE_ATTRIBUTE = "coreDevices"
MODES = ("off", "on", "node-label")
#: The DeviceClass ``neuroncore.aws.com``: the core devices.
CORE_CLASS = "neuroncore.aws.com"
CORE_CLASS_SELECTOR = (f'device.driver == "{DRA_DRIVER_NAME}" && '
                       f'device.attributes["{DRA_DRIVER_NAME}"].resourceType == "{RESOURCE_TYPE}"')
#: ``neuron.aws.com`` while core devices are on: everything but the cores (chips, and ``neuron-node``).
CHIP_CLASS_SELECTOR = (f'device.driver == "{DRA_DRIVER_NAME}" && '
                       f'device.attributes["{DRA_DRIVER_NAME}"].resourceType != "{RESOURCE_TYPE}"')
#: ``neuron.aws.com`` while core devices are off (every device of the driver).
PLAIN_CLASS_SELECTOR = f'device.driver == "{DRA_DRIVER_NAME}"'


def parse_core_device(name: str) -> tuple[int, int] | None:
    """``neuron-device-3-core-1`` -> (3, 1); None for any other name."""
    if not name.startswith(DEVICE_PREFIX):
        return None
    chip_text, sep, core_text = name[len(DEVICE_PREFIX):].partition(CORE_INFIX)
    chip, core = parse_index(chip_text), parse_index(core_text)
    if not sep or chip is None or core is None:
        return None
    return chip, core


def counter_name(physical: int) -> str:
    return f"core-{physical}"


def counter_set_name(chip: int) -> str:
    return device_name(chip)


def chip_counters(dev: NeuronDevice) -> CounterSet | None:
    """The chip's counter set; None for a chip whose core count is unknown (it then gets no core devices)."""
    if dev.core_count <= 0:
        return None
    return CounterSet(counter_set_name(dev.index), {counter_name(p): 1 for p in range(dev.core_count)})


def _consumes(chip: int, cores: Sequence[int] | range) -> dict[str, dict[str, int]]:
    return {counter_set_name(chip): {counter_name(p): 1 for p in cores}}


#: The chip's attributes a core device carries too (when the chip has them).
CHIP_ATTRIBUTES = ("deviceId", "instanceType", *(attribute_name(n) for n in GROUP_SIZES))


def core_attributes(inv: NeuronInventory, core: int, chip: Mapping[str, AttributeValue]) -> dict[str, AttributeValue]:
    """A core device's attributes: its own, and those of ``chip`` (the chip's) a core carries too."""
    attrs: dict[str, AttributeValue] = {"resourceType": RESOURCE_TYPE, "coreIndex": core}
    attrs.update((k, chip[k]) for k in CHIP_ATTRIBUTES if k in chip)
    if inv.lnc_applies and inv.lnc is not None:
        attrs["logicalNeuronCore"] = inv.lnc
    return attrs


def partitioned(inv: NeuronInventory, chips: Sequence[SliceDevice], dra_version: str, *,
                gate: str | None = None) -> tuple[list[SliceDevice], list[CounterSet]]:
    """The chips (each now consuming its whole counter set), then every chip's core devices in chip order, and
    the counter sets. ``chips`` are the chip devices in ``inv.devices`` order; ``gate``: the core devices'
    ``node_label_gate`` and the gate of the chips' consumption of their sets (published only on Nodes that opt in;
    elsewhere the pool is the chips alone, as without core devices)."""
    out_chips: list[SliceDevice] = []
    cores: list[SliceDevice] = []
    counters: list[CounterSet] = []
    for dev, chip in zip(inv.devices, chips, strict=True):
        cs = chip_counters(dev)
        if cs is None:
            out_chips.append(chip)
            continue
        counters.append(cs)
        out_chips.append(replace(chip, consumes={**chip.consumes, **_consumes(dev.index, range(dev.core_count))},
                                 consumes_gates={counter_set_name(dev.index): gate} if gate else {}))
        for k in range(logical_cores(dev, inv.lnc)):
            cores.append(SliceDevice(core_device_name(dev.index, k),
                                     core_attributes(inv, k, chip.attributes),
                                     consumes=_consumes(dev.index, core_ids(k, inv.lnc or 1)),  # its physical cores
                                     node_label_gate=gate))
    return out_chips + cores, counters
