"""EFA metrics: hw counters at device and port scope, port state, health, allocations; bad counter files."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
from hostcache import copy_host, own_paths
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from accel_core.fakehost import FakeHost
from accel_core.metrics import CallbackCollector
from efa_plugin.fakehost import EFA_DEVICE_COUNTERS, EFA_PORT_COUNTERS
from efa_plugin.metrics import EfaMetrics
from efa_plugin.policy import EfaPolicy

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]
Setup = tuple[FakeHost, EfaPolicy, CollectorRegistry, set[str]]


def scrape(registry: CollectorRegistry) -> Samples:
    text = generate_latest(registry).decode()
    out: Samples = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def value(samples: Samples, name: str, **labels: str) -> float | None:
    for (n, lbls), v in samples.items():
        if n == name and all(dict(lbls).get(k) == w for k, w in labels.items()):
            return v
    return None


@pytest.fixture
def setup(tmp_path: Path) -> Setup:
    host = copy_host(tmp_path / "host", "p5en.48xlarge")
    policy = EfaPolicy(own_paths(host))
    policy.rediscover()
    in_use: set[str] = {"0000:55:00.0"}
    registry = CollectorRegistry()
    registry.register(CallbackCollector(EfaMetrics(policy, lambda: in_use)))
    return host, policy, registry, in_use


def test_every_counter_at_both_scopes_with_labels(setup: Setup) -> None:
    host, _, registry, _ = setup
    host.set_efa_counter("rdmap85s0", "retrans_pkts", 17, port=1)
    host.set_efa_counter("rdmap85s0", "impaired_remote_conn_events", 2, port=1)
    host.set_efa_counter("rdmap86s0", "cmds_err", 5)
    samples = scrape(registry)
    names = {n for n, _ in samples}
    for counter in EFA_DEVICE_COUNTERS:
        assert f"efa_device_{counter}_total" in names
    for counter in EFA_PORT_COUNTERS:
        assert f"efa_port_{counter}_total" in names
    assert not any("lifespan" in n for n in names)
    labels = {"device": "rdmap85s0", "pci_address": "0000:55:00.0", "numa_node": "0", "port": "1"}
    assert value(samples, "efa_port_retrans_pkts_total", **labels) == 17
    assert value(samples, "efa_port_impaired_remote_conn_events_total", **labels) == 2
    assert value(samples, "efa_device_cmds_err_total", device="rdmap86s0", pci_address="0000:56:00.0") == 5
    assert value(samples, "efa_device_cmds_err_total", device="rdmap85s0") == 0
    # 16 devices x (12 device + 22 port counters)
    assert sum(1 for n, _ in samples if n.startswith(("efa_device_", "efa_port_")) and n.endswith("_total")
               and n not in ("efa_device_allocations_total",)) == 16 * (12 + 22)


def test_port_state_health_and_allocations(setup: Setup) -> None:
    host, policy, registry, in_use = setup
    host.set_port_state("rdmap102s0", "DOWN")
    policy.rediscover()
    policy.allocate(["0000:55:00.0"])
    policy.allocate(["0000:55:00.0", "0000:56:00.0"])
    samples = scrape(registry)
    assert value(samples, "efa_port_active", device="rdmap102s0") == 0
    assert value(samples, "efa_port_state", device="rdmap102s0", state="DOWN") == 1
    assert value(samples, "efa_port_active", device="rdmap103s0") == 1
    assert value(samples, "efa_device_healthy", device="rdmap102s0") == 0
    assert value(samples, "efa_device_healthy", device="rdmap85s0") == 1
    assert value(samples, "efa_device_allocated", device="rdmap85s0") == 1
    assert value(samples, "efa_device_allocated", device="rdmap86s0") == 0
    assert value(samples, "efa_device_allocations_total", device="rdmap85s0") == 2
    assert value(samples, "efa_device_allocations_total", device="rdmap86s0") == 1
    assert value(samples, "efa_device_info", device="rdmap85s0", pcie_root="pci0000:4a") == 1
    in_use.clear()
    assert value(scrape(registry), "efa_device_allocated", device="rdmap85s0") == 0


def test_no_allocated_series_when_kubelet_unreachable(tmp_path: Path) -> None:
    host = copy_host(tmp_path / "host", "p4d.24xlarge")
    policy = EfaPolicy(own_paths(host))
    policy.rediscover()
    registry = CollectorRegistry()
    registry.register(CallbackCollector(EfaMetrics(policy, lambda: None)))
    samples = scrape(registry)
    assert value(samples, "efa_device_allocated") is None
    assert value(samples, "efa_device_healthy", device="rdmap16s27") == 1


def test_unreadable_and_malformed_counters_are_skipped_and_logged_once(
    setup: Setup, caplog: pytest.LogCaptureFixture
) -> None:
    host, _, registry, _ = setup
    caplog.set_level(logging.WARNING, logger="efa_plugin.metrics")
    counters = host.ibdev_dir("rdmap85s0") / "ports" / "1" / "hw_counters"
    (counters / "rx_drops").unlink()
    (counters / "rx_drops").mkdir()  # unreadable (EISDIR)
    (counters / "tx_pkts").write_text("lots\n")
    (counters / "tx_bytes").unlink()  # missing: silently absent
    for _ in range(3):
        samples = scrape(registry)
    assert value(samples, "efa_port_rx_drops_total", device="rdmap85s0") is None
    assert value(samples, "efa_port_tx_pkts_total", device="rdmap85s0") is None
    assert value(samples, "efa_port_tx_bytes_total", device="rdmap85s0") is None
    assert value(samples, "efa_port_rx_drops_total", device="rdmap86s0") == 0
    assert value(samples, "efa_counter_read_errors_total", device="rdmap85s0") == 6
    logged = [r for r in caplog.records if r.getMessage().startswith("EFA counter unreadable")]
    assert sorted(Path(r.kv["path"]).name for r in logged) == ["rx_drops", "tx_pkts"]  # type: ignore[attr-defined]


def test_counters_only_under_the_port_as_older_drivers_do(tmp_path: Path) -> None:
    host = copy_host(tmp_path / "host", "p4d.24xlarge")
    for f in (host.ibdev_dir("rdmap16s27") / "hw_counters").iterdir():
        f.unlink()
    (host.ibdev_dir("rdmap16s27") / "hw_counters").rmdir()
    host.write("/sys/class/infiniband/rdmap16s27/ports/1/hw_counters/cmds_err", "3\n")
    policy = EfaPolicy(own_paths(host))
    policy.rediscover()
    registry = CollectorRegistry()
    registry.register(CallbackCollector(EfaMetrics(policy)))
    samples = scrape(registry)
    assert value(samples, "efa_port_cmds_err_total", device="rdmap16s27") == 3
    assert value(samples, "efa_device_cmds_err_total", device="rdmap16s27") is None
    assert value(samples, "efa_device_cmds_err_total", device="rdmap32s27") == 0
