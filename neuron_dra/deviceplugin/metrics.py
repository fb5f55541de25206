"""Scrape-time metrics read from sysfs plus the plugin's own state.

Names shared with neuron-monitor's Prometheus exporter keep its names and labels:
``neurondevice_hw_ecc_events_total{neuron_device_index,event_type}`` and
``neuroncore_memory_usage_<category>{neuroncore,memory_location}`` (``neuroncore`` = global logical core index in
host numbering; a logical core sums its physical cores). Everything else is ``neuron_device_plugin_*``.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from accel_core.hostfiles import HostValueError, read_int
from neuron_dra.coreids import core_id
from neuron_dra.deviceplugin.inuse import NEURON, NEURONCORE
from neuron_dra.deviceplugin.node import NeuronNode
from neuron_dra.discovery import CLASS_DIR

ECC_EVENT_TYPES = ("mem_ecc_uncorrected", "mem_ecc_repairable_uncorrected", "sram_ecc_uncorrected")
MONITOR_MEMORY_CATEGORIES = ("constants", "model_code", "model_shared_scratchpad", "runtime_memory", "tensors")
STATUS_COUNTERS = ("success", "failure", "timeout", "hw_error", "hw_hbm_ue_error", "hw_nc_ue_error",
                   "hw_dma_abort_error", "hw_collectives_error", "exec_bad_input", "generic_error")


def _read_int(path: str) -> int | None:
    """A counter file's value; None when it is absent or malformed (discovery reports the device's problems)."""
    try:
        return read_int(path)
    except HostValueError:
        return None


def _listdir(path: str) -> list[str]:
    try:
        return sorted(os.listdir(path))
    except OSError:
        return []


class NeuronMetrics:
    """Produces the metric families on every scrape (wrap in ``accel_core.metrics.CallbackCollector``)."""

    def __init__(self, node: NeuronNode) -> None:
        self.node = node

    def produce(self) -> Iterator[Metric]:
        node = self.node
        inv = node.inventory
        dev_label = ["neuron_device_index"]
        ecc = CounterMetricFamily("neurondevice_hw_ecc_events", "Neuron device ECC events (sysfs stats/hardware)",
                                  labels=[*dev_label, "event_type"])
        status = CounterMetricFamily("neuron_device_plugin_core_status",
                                     "Per physical NeuronCore execution status counters (sysfs stats/status)",
                                     labels=[*dev_label, "physical_core", "status"])
        mem_used = GaugeMetricFamily("neuron_device_plugin_device_memory_used_bytes",
                                     "Device memory in use, all cores and categories", labels=dev_label)
        mem_total = GaugeMetricFamily("neuron_device_plugin_device_memory_total_bytes",
                                      "Device memory size", labels=dev_label)
        healthy = GaugeMetricFamily("neuron_device_plugin_device_healthy", "1 when the device is healthy",
                                    labels=dev_label)
        present = GaugeMetricFamily("neuron_device_plugin_device_present",
                                    "1 when the sysfs entry and /dev node exist", labels=dev_label)
        per_core = {cat: GaugeMetricFamily(f"neuroncore_memory_usage_{cat}",
                                           f"NeuronCore device memory used for {cat} (bytes)",
                                           labels=["neuroncore", "memory_location"])
                    for cat in MONITOR_MEMORY_CATEGORIES}
        lcpd = inv.logical_cores_per_device()
        phys = inv.physical_cores_per_device()
        ratio = max(1, phys // lcpd) if lcpd else 1
        for dev in inv.devices:
            idx = str(dev.index)
            healthy.add_metric([idx], 1.0 if node.health.healthy(dev.index) else 0.0)
            present.add_metric([idx], 1.0 if dev.present else 0.0)
            mem_total.add_metric([idx], float(dev.memory_bytes))
            if not dev.present:
                continue
            base = str(node.paths.host(f"{CLASS_DIR}/neuron{dev.index}"))
            for event in ECC_EVENT_TYPES:
                value = _read_int(f"{base}/stats/hardware/{event}/total")
                if value is None:
                    value = _read_int(f"{base}/stats/hardware/{event}")
                if value is not None:
                    ecc.add_metric([idx, event], float(value))
            used_total = 0
            logical: dict[int, dict[str, int]] = {}
            for core in range(dev.core_count):
                cdir = f"{base}/neuron_core{core}"
                for name in STATUS_COUNTERS:
                    value = _read_int(f"{cdir}/stats/status/{name}/total")
                    if value is not None:
                        status.add_metric([idx, str(core), name], float(value))
                mem_dir = f"{cdir}/stats/memory_usage/device_mem"
                gcore = core_id(dev.index, lcpd, core // ratio)
                for cat in _listdir(mem_dir):
                    value = _read_int(f"{mem_dir}/{cat}/present")
                    if value is None:
                        continue
                    used_total += value
                    if cat in per_core:
                        bucket = logical.setdefault(gcore, {})
                        bucket[cat] = bucket.get(cat, 0) + value
            mem_used.add_metric([idx], float(used_total))
            for gcore, cats in sorted(logical.items()):
                for cat, value in cats.items():
                    per_core[cat].add_metric([str(gcore), "device_mem"], float(value))
        yield from (ecc, status, mem_used, mem_total, healthy, present, *per_core.values())
        yield from self._plugin_state()

    def _plugin_state(self) -> Iterator[Metric]:
        node = self.node
        inv = node.inventory
        info = GaugeMetricFamily("neuron_device_plugin_info", "Node facts the plugin discovered",
                                 labels=["instance_type", "driver_version", "lnc", "topology"])
        info.add_metric([inv.instance_type, inv.driver_version or "", str(inv.lnc) if inv.lnc_applies else "",
                         inv.topology.kind], 1.0)
        in_use = GaugeMetricFamily("neuron_device_plugin_ids_in_use",
                                   "IDs in use (PodResources List plus unconfirmed Allocate)", labels=["resource"])
        withheld = GaugeMetricFamily("neuron_device_plugin_ids_withheld",
                                     "IDs advertised Unhealthy because the other resource holds their device",
                                     labels=["resource"])
        by_cores = node.devices_used_by_cores()
        whole = node.devices_used_whole()
        for resource in (NEURON, NEURONCORE):
            in_use.add_metric([resource], float(len(node.usage.in_use(resource))))
        withheld.add_metric([NEURON], float(len(by_cores)))
        withheld.add_metric([NEURONCORE], float(len(whole) * node.cores_per_device))
        conflicts = GaugeMetricFamily("neuron_device_plugin_double_allocated_devices",
                                      "Devices held by both resources at once (should stay 0)")
        conflicts.add_metric([], float(len(node.conflicts())))
        problems = GaugeMetricFamily("neuron_device_plugin_host_problems",
                                     "Problems found reading the host's Neuron files")
        problems.add_metric([], float(len(inv.all_problems())))
        yield from (info, in_use, withheld, conflicts, problems)
