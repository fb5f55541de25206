"""Per-driver metrics of the DRA core, named ``<prefix>_...`` by the driver profile (``neuron_dra``, ``efa_dra``),
on top of the generic DRA plugin's per-claim counts and latency histograms and the slice publisher's write
counters (``accel_dra_*``, labelled by driver), all in the same registry."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram


class DriverMetrics:
    def __init__(self, registry: CollectorRegistry | None, prefix: str = "accel_dra_driver") -> None:
        reg = registry if registry is not None else CollectorRegistry()
        self.prepared_claims = Gauge(f"{prefix}_prepared_claims", "Claims prepared on this node", registry=reg)
        self.prepared_devices = Gauge(f"{prefix}_prepared_devices", "Devices held by prepared claims",
                                      registry=reg)
        self.claim_errors = Counter(f"{prefix}_claim_errors_total", "Prepare/unprepare failures, by operation",
                                    ["operation"], registry=reg)
        self.claim_read_seconds = Histogram(
            f"{prefix}_claim_read_duration_seconds", "Time to read a claim from the API server during prepare",
            registry=reg, buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1, 5))
        self.prepare_local_seconds = Histogram(
            f"{prefix}_prepare_local_duration_seconds",
            "Prepare time without the API read (config, checkpoint, CDI spec)", registry=reg,
            buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.02, 0.05, 0.1, 0.5))
        self.prepare_phase_seconds = Histogram(
            f"{prefix}_prepare_phase_duration_seconds",
            "Time one prepare request spent in each phase: guard (device-plugin check), read (claims from the API "
            "server, all at once), plan (config, edits, conflict checks), cdi (spec files), checkpoint (the one "
            "durable write)", ["phase"], registry=reg,
            buckets=(0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.5))
        self.devices = Gauge(f"{prefix}_devices", "Devices this driver publishes on this node", registry=reg)
        self.held_by_device_plugin = Gauge(
            f"{prefix}_devices_held_by_device_plugin",
            "Devices left out of the ResourceSlices because running pods hold them through the device plugin",
            registry=reg)
        self.device_healthy = Gauge(f"{prefix}_device_healthy", "1 when the device is healthy, 0 otherwise",
                                    ["device"], registry=reg)
        self.cdi_specs_restored = Counter(f"{prefix}_cdi_specs_restored_total",
                                          "CDI specs re-created from the checkpoint (after a reboot or loss)",
                                          registry=reg)
        self.stale_claims_cleaned = Counter(
            f"{prefix}_stale_claims_cleaned_total",
            "Checkpoint entries unprepared because the API server says their claim is stale, by reason", ["reason"],
            registry=reg)
