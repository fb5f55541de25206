"""EFA metrics, read at scrape time: every hw counter the host exposes, port state, health and allocations.

Names (all with labels ``device`` = ibdev name, ``pci_address``, ``numa_node`` = ``-1`` when unknown):

- ``efa_device_<counter>_total``: each file in ``<ibdev>/hw_counters`` (``cmds_err``, ``create_qp_err``, ...);
- ``efa_port_<counter>_total{port}``: each file in ``<ibdev>/ports/<port>/hw_counters`` (``tx_bytes``,
  ``rx_drops``, ``retrans_pkts``, ``unresponsive_remote_events``, ``impaired_remote_conn_events``, ...);
- ``efa_port_active{port}`` 1/0 and ``efa_port_state{port,state}`` = 1 with the kernel's state name;
- ``efa_device_healthy`` 1/0 (what the kubelet is told), ``efa_device_info{uverbs,pcie_root}`` = 1;
- ``efa_device_allocated`` 1/0 from the kubelet's PodResources API (absent when it cannot be reached) and
  ``efa_device_allocations_total`` (Allocate responses that included the device since the daemon started);
- ``efa_counter_read_errors_total``: counter files that could not be read (each path is logged once).

The ``lifespan`` file (the kernel's counter cache time) is not a counter and is skipped; so are files that are
missing or answer EOPNOTSUPP, as some drivers do for counters the device lacks.
"""

from __future__ import annotations

import errno
import logging
import os
import re
from collections.abc import Callable, Iterable
from pathlib import Path

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from accel_core.health import HEALTHY
from accel_core.hostfiles import HostValueError, parse_index, parse_int, printable, read_attr
from accel_core.logs import kv
from accel_core.podresources import PodResourcesClient, PodResourcesUnavailable
from efa_plugin.discovery import MAX_PORT, EfaDevice
from efa_plugin.policy import EfaPolicy

log = logging.getLogger(__name__)

BASE_LABELS = ("device", "pci_address", "numa_node")
PORT_LABELS = (*BASE_LABELS, "port")
NOT_COUNTERS = frozenset({"lifespan"})
_SILENT_ERRNOS = frozenset({errno.ENOENT, errno.EOPNOTSUPP, errno.ENOTSUP, errno.ENODEV})
_COUNTER_NAME_RE = re.compile(r"[a-z_][a-z0-9_]{0,63}", re.ASCII)
_MAX_LOGGED_PATHS = 1024


def base_labels(dev: EfaDevice) -> list[str]:
    return [dev.ibdev, dev.pci_address, str(dev.numa_node if dev.numa_node is not None else -1)]


class AllocatedDevices:
    """Device IDs of one resource that pods hold now, from the kubelet's PodResources ``List`` (blocking call).

    Meant for the scrape thread. Returns None when the kubelet cannot be asked (no socket, timeout, error).
    """

    def __init__(self, socket: Path, resource: str, timeout: float = 1.0) -> None:
        self._client = PodResourcesClient(socket, timeout)
        self._resource = resource

    def __call__(self) -> set[str] | None:
        try:
            return self._client.in_use([self._resource])[self._resource]
        except PodResourcesUnavailable as exc:
            log.debug("pod resources unavailable", extra=kv(socket=str(self._client.socket), error=exc))
            return None

    def close(self) -> None:
        self._client.close()


class EfaMetrics:
    """Produces the EFA metric families for one scrape (use with ``accel_core.metrics.CallbackCollector``)."""

    def __init__(self, policy: EfaPolicy, allocated: Callable[[], set[str] | None] | None = None) -> None:
        self._policy = policy
        self._allocated = allocated
        self._logged: set[str] = set()
        self._read_errors: dict[str, int] = {}

    def __call__(self) -> Iterable[Metric]:
        inventory, health = self._policy.snapshot()
        devices = inventory.devices
        counts = dict(self._policy.allocation_counts)
        allocated = self._allocated() if self._allocated is not None else None

        info = GaugeMetricFamily("efa_device_info", "EFA device identity (value 1)",
                                 labels=(*BASE_LABELS, "uverbs", "pcie_root"))
        healthy = GaugeMetricFamily("efa_device_healthy", "1 when the device is advertised Healthy",
                                    labels=BASE_LABELS)
        handed = CounterMetricFamily("efa_device_allocations",
                                     "Allocate responses that included the device since the plugin started",
                                     labels=BASE_LABELS)
        in_use = GaugeMetricFamily("efa_device_allocated", "1 while a pod holds the device (kubelet PodResources)",
                                   labels=BASE_LABELS)
        active = GaugeMetricFamily("efa_port_active", "1 when the port state is ACTIVE", labels=PORT_LABELS)
        state = GaugeMetricFamily("efa_port_state", "Port state name as the kernel reports it (value 1)",
                                  labels=(*PORT_LABELS, "state"))
        families: dict[str, CounterMetricFamily] = {}
        for dev in devices:
            labels = base_labels(dev)
            info.add_metric([*labels, dev.uverbs, dev.pcie_root or ""], 1)
            healthy.add_metric(labels, 1 if health.get(dev.id, HEALTHY).healthy else 0)
            handed.add_metric(labels, counts.get(dev.id, 0))
            if allocated is not None:
                in_use.add_metric(labels, 1 if dev.id in allocated else 0)
            base = str(dev.sysfs_dir)
            self._counters(dev, f"{base}/hw_counters", "efa_device_", labels, families)
            for port in _ports(base):
                port_labels = [*labels, port]
                text = self._read(f"{base}/ports/{port}/state")
                if text is not None:
                    name = text.split(":", 1)[-1].strip()
                    active.add_metric(port_labels, 1 if name == "ACTIVE" else 0)
                    state.add_metric([*port_labels, name], 1)
                self._counters(dev, f"{base}/ports/{port}/hw_counters", "efa_port_", port_labels, families)
        errors = CounterMetricFamily("efa_counter_read_errors", "hw counter files that could not be read",
                                     labels=("device",))
        for device, n in sorted(self._read_errors.items()):
            errors.add_metric([device], n)
        yield from (info, healthy, handed, active, state, errors)
        if allocated is not None:
            yield in_use
        yield from (families[name] for name in sorted(families))

    def _counters(self, dev: EfaDevice, directory: str, prefix: str, labels: list[str],
                  families: dict[str, CounterMetricFamily]) -> None:
        try:
            names = sorted(e.name for e in os.scandir(directory) if e.name not in NOT_COUNTERS)
        except OSError:
            return  # no counters at this scope (older drivers keep them all under the port)
        for name in names:
            path = f"{directory}/{name}"
            if not _COUNTER_NAME_RE.fullmatch(name):  # two spellings of one name would make a duplicate series
                self._fail(path, dev.ibdev, "not a counter name")
                continue
            text = self._read(path, device=dev.ibdev)
            if text is None:
                continue
            try:
                value = parse_int(text, path)
            except HostValueError as exc:
                self._fail(path, dev.ibdev, str(exc).removeprefix(f"{path}: "))
                continue
            metric = prefix + name
            family = families.get(metric)
            if family is None:
                scope = "device" if prefix == "efa_device_" else "port"
                family = families[metric] = CounterMetricFamily(
                    metric, f"EFA {scope}-scope hw counter {name} (sysfs hw_counters)", labels=labels_for(prefix))
            family.add_metric(labels, value)

    def _read(self, path: str, device: str | None = None) -> str | None:
        """A small sysfs file's text; None (logged once per path when unexpected) if it cannot be read."""
        try:
            return read_attr(path)
        except HostValueError as exc:
            cause = exc.__cause__
            silent = isinstance(cause, OSError) and cause.errno in _SILENT_ERRNOS
            if not silent and device is not None:
                self._fail(path, device, str(exc).removeprefix(f"{path}: "))
            return None

    def _fail(self, path: str, device: str, why: str) -> None:
        self._read_errors[device] = self._read_errors.get(device, 0) + 1
        key = printable(path)
        if key not in self._logged and len(self._logged) < _MAX_LOGGED_PATHS:
            self._logged.add(key)
            log.warning("EFA counter unreadable; skipped in metrics", extra=kv(device=device, path=key, error=why))


def labels_for(prefix: str) -> tuple[str, ...]:
    return PORT_LABELS if prefix == "efa_port_" else BASE_LABELS


def _ports(ib_dir: str) -> list[str]:
    try:
        numbered = {p: n for p in os.listdir(f"{ib_dir}/ports") if (n := parse_index(p, maximum=MAX_PORT)) is not None}
    except OSError:
        return []
    return sorted(numbered, key=numbered.__getitem__)
