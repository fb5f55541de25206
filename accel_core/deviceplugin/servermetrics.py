"""The device-plugin servers' own metrics, one set per registry (every server of a daemon shares it, labelled by
resource). prometheus_client is imported only when a set is made: a daemon registers before it loads it."""

from __future__ import annotations

import weakref
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry

_METRICS_BY_REGISTRY: weakref.WeakKeyDictionary[CollectorRegistry, DevicePluginMetrics] = weakref.WeakKeyDictionary()


def metrics_for(registry: CollectorRegistry | None) -> DevicePluginMetrics:
    """One metrics set per registry, shared by every server of a daemon (they differ by the resource label)."""
    if registry is None:
        from prometheus_client import CollectorRegistry

        return DevicePluginMetrics(CollectorRegistry())
    found = _METRICS_BY_REGISTRY.get(registry)
    if found is None:
        found = _METRICS_BY_REGISTRY[registry] = DevicePluginMetrics(registry)
    return found


class DevicePluginMetrics:
    """Server-level metrics, labelled by resource."""

    def __init__(self, reg: CollectorRegistry) -> None:
        from prometheus_client import Counter, Gauge, Histogram

        self.registered = Gauge("accel_device_plugin_registered", "1 while registered with the kubelet",
                                ["resource"], registry=reg)
        self.registrations = Counter("accel_device_plugin_registrations_total",
                                     "Successful Register calls to the kubelet", ["resource"], registry=reg)
        self.devices = Gauge("accel_device_plugin_devices", "Advertised devices by health",
                             ["resource", "health"], registry=reg)
        self.allocations = Counter("accel_device_plugin_allocate_requests_total",
                                   "Allocate container requests by result", ["resource", "result"], registry=reg)
        self.allocate_seconds = Histogram("accel_device_plugin_allocate_duration_seconds",
                                          "Allocate RPC latency", ["resource"], registry=reg,
                                          buckets=(0.0005, 0.001, 0.002, 0.005, 0.01, 0.05, 0.1, 1.0))
