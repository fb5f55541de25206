"""Neuron discovery on fake hosts: counts for every catalog type, LNC, PCI facts, and bad host files."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest
from hostcache import copy_host, shared_host
from neuron_facts import TRN2_LINKS
from neuron_listings import TRN2_48XLARGE_GUIDE

from accel_core.awsfacts import catalog
from accel_core.fakehost import FakeHost
from accel_core.paths import HostPaths
from neuron_dra.deviceplugin import cli
from neuron_dra.discovery import LNC_FILE, discover
from neuron_dra.driver_sysfs import parse_connected, parse_lnc

TRN2 = ("trn2.3xlarge", "trn2.48xlarge", "trn2u.48xlarge")

# (devices, logical cores) per type; LNC types are listed per LNC setting (None = file absent = default 2).
EXPECTED = {
    ("inf1.xlarge", None): (1, 4),
    ("inf2.xlarge", None): (1, 2),
    ("inf2.24xlarge", None): (6, 12),
    ("inf2.48xlarge", None): (12, 24),
    ("trn1.2xlarge", None): (1, 2),
    ("trn1.32xlarge", None): (16, 32),
    ("trn1n.32xlarge", None): (16, 32),
    ("trn2.3xlarge", None): (1, 4),
    ("trn2.3xlarge", 2): (1, 4),
    ("trn2.3xlarge", 1): (1, 8),
    ("trn2.48xlarge", None): (16, 64),
    ("trn2.48xlarge", 2): (16, 64),
    ("trn2.48xlarge", 1): (16, 128),
    ("trn2u.48xlarge", 2): (16, 64),
    ("trn2u.48xlarge", 1): (16, 128),
    ("c5.large", None): (0, 0),
    ("p5.48xlarge", None): (0, 0),
}


def host(tmp_path: Path, itype: str, lnc: int | None = None) -> tuple[FakeHost, HostPaths]:
    """A fresh tree for tests that mutate it."""
    fake = copy_host(tmp_path / "host", itype, lnc=lnc)
    return fake, HostPaths(host_root=fake.root)


@pytest.fixture
def pristine() -> Callable[[str, int | None], Path]:
    """Read-only trees, built once per (type, LNC) for the whole session (tests/hostcache.py)."""
    return lambda itype, lnc=None: shared_host(itype, lnc=lnc).root


def test_every_catalog_type_has_an_expectation() -> None:
    assert {t for t, _ in EXPECTED} >= {t for t in catalog.names() if catalog.get(t).neuron is not None}


@pytest.mark.parametrize(("itype", "lnc"), sorted(EXPECTED, key=str))
def test_counts_per_instance_type(pristine: Callable[[str, int | None], Path], itype: str, lnc: int | None,
                                  capsys: pytest.CaptureFixture[str]) -> None:
    root = pristine(itype, lnc)
    inv = discover(HostPaths(host_root=root))
    devices, cores = EXPECTED[(itype, lnc)]
    assert (len(inv.devices), inv.total_logical_cores()) == (devices, cores)
    assert inv.all_problems() == []
    assert inv.instance_type == itype
    assert cli.main(["ls", "--host-root", str(root), "--output", "json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["resources"] == {"aws.amazon.com/neuron": devices, "aws.amazon.com/neuroncore": cores}
    assert [d["index"] for d in report["devices"]] == list(range(devices))


@pytest.mark.parametrize("itype", TRN2)
def test_lnc_applies_only_on_trainium2(pristine: Callable[[str, int | None], Path], itype: str) -> None:
    inv = discover(HostPaths(host_root=pristine(itype, None)))
    assert inv.lnc_applies and inv.lnc == 2
    assert inv.logical_cores_per_device() == 4 and inv.physical_cores_per_device() == 8


def test_lnc_file_ignored_where_lnc_does_not_apply(tmp_path: Path) -> None:
    fake, paths = host(tmp_path, "inf2.xlarge")
    fake.write(LNC_FILE, "NEURON_LOGICAL_NC_CONFIG=1\n")
    inv = discover(paths)
    assert (inv.lnc, inv.lnc_applies, inv.total_logical_cores()) == (None, False, 2)


def test_device_facts_on_trn2_48xlarge(pristine: Callable[[str, int | None], Path]) -> None:
    inv = discover(HostPaths(host_root=pristine("trn2.48xlarge", None)))
    dev = inv.device(8)
    assert dev.arch == "trn2" and dev.device_name == "Trainium2" and dev.core_count == 8
    assert dev.connected == TRN2_LINKS[8]  # the trn2 driver's neighbour table (neuron.md section 3)
    _, bdf, numa = TRN2_48XLARGE_GUIDE[8]  # a real neuron-ls listing
    assert (dev.pci_address, dev.numa_node) == (bdf, numa)
    assert dev.pcie_root == "pci0000:78"  # not printed by neuron-ls: the fake host's root of that bus
    assert dev.dev_node == "/dev/neuron8" and dev.present and dev.uncorrected_errors == 0
    assert dev.memory_bytes == 96 * 1024**3
    assert inv.driver_version == "2.25.4.0"
    assert inv.topology.kind == "torus4x4" and inv.topology.source == "connected_devices"
    with pytest.raises(KeyError, match="no Neuron device 16"):
        inv.device(16)


def test_small_instance_has_no_numa(pristine: Callable[[str, int | None], Path]) -> None:
    dev = discover(HostPaths(host_root=pristine("inf2.xlarge", None))).device(0)
    assert dev.pci_address == "0000:00:1f.0" and dev.numa_node is None and dev.arch == "inf2"


# -------------------------------------------------------------------------------------------- bad input


def test_malformed_connected_devices_falls_back_to_catalog(tmp_path: Path) -> None:
    fake, paths = host(tmp_path, "trn1.32xlarge")
    fake.corrupt("/sys/class/neuron_device/neuron5/connected_devices", "4, nine, 1\n")
    inv = discover(paths)
    dev = inv.device(5)
    assert any(p.startswith("/sys/class/neuron_device/neuron5/connected_devices:") and "nine" in p
               for p in dev.problems)
    assert set(dev.connected) == {1, 4, 6, 9}
    assert inv.topology.kind == "torus4x4"


def test_connected_devices_naming_a_missing_device(tmp_path: Path) -> None:
    fake, paths = host(tmp_path, "trn1.32xlarge")
    fake.corrupt("/sys/class/neuron_device/neuron0/connected_devices", "12, 1, 3, 17\n")
    inv = discover(paths)
    (problem,) = inv.device(0).problems
    assert problem.startswith("/sys/class/neuron_device/neuron0/connected_devices:")
    assert "[17]" in problem and "do not exist" in problem and "catalog" in problem
    assert set(inv.device(0).connected) == {1, 3, 4, 12}
    assert inv.topology.kind == "torus4x4"


@pytest.mark.parametrize("text", ["0", "abc", "-2", "9", ""])
def test_bad_core_count_falls_back_to_catalog(tmp_path: Path, text: str) -> None:
    fake, paths = host(tmp_path, "trn2.3xlarge", lnc=1)
    fake.corrupt("/sys/class/neuron_device/neuron0/core_count", text)
    inv = discover(paths)
    assert any(p.startswith("/sys/class/neuron_device/neuron0/core_count:") for p in inv.device(0).problems)
    assert inv.device(0).core_count == 8
    assert inv.total_logical_cores() == 8


def test_bad_core_count_without_catalog_uses_the_other_devices(tmp_path: Path) -> None:
    fake, paths = host(tmp_path, "inf2.24xlarge")
    fake.corrupt("/sys/class/dmi/id/product_name", "x9.mystery\n")
    fake.corrupt("/sys/class/neuron_device/neuron2/core_count", "zero")
    inv = discover(paths)
    assert inv.instance_type == "x9.mystery"
    assert inv.device(2).core_count == 2 and inv.total_logical_cores() == 12
    assert inv.topology.kind == "chain"


@pytest.mark.parametrize("text", ["NEURON_LOGICAL_NC_CONFIG=3\n", "garbage\n", "NEURON_LOGICAL_NC_CONFIG=\n", ""])
def test_bad_lnc_file_falls_back_to_default(tmp_path: Path, text: str) -> None:
    fake, paths = host(tmp_path, "trn2.3xlarge", lnc=1)
    fake.corrupt(LNC_FILE, text)
    inv = discover(paths)
    assert inv.lnc == 2 and inv.total_logical_cores() == 4
    assert any(p.startswith(f"{LNC_FILE}:") and "using LNC 2" in p for p in inv.problems)


def test_irregular_links_on_a_catalog_type_use_the_catalog(tmp_path: Path) -> None:
    fake, paths = host(tmp_path, "inf2.48xlarge")
    fake.corrupt("/sys/class/neuron_device/neuron4/connected_devices", "3\n")  # breaks the ring, still valid ids
    inv = discover(paths)
    assert inv.topology.kind == "ring" and inv.topology.source == "catalog"
    assert any("instance catalog says ring" in p for p in inv.problems)


def test_unknown_type_with_irregular_links_is_unconnected(tmp_path: Path) -> None:
    fake, paths = host(tmp_path, "inf2.24xlarge")
    fake.corrupt("/sys/class/dmi/id/product_name", "\n")
    fake.corrupt("/sys/class/neuron_device/neuron0/connected_devices", "3\n")
    inv = discover(paths)
    assert inv.instance_type == ""
    assert inv.topology.kind == "none"
    assert any("product_name" in p for p in inv.problems)
    assert any("not in the catalog" in p for p in inv.problems)


def test_removed_device_stays_listed_as_not_present(tmp_path: Path) -> None:
    fake, paths = host(tmp_path, "trn1.32xlarge")
    fake.remove_neuron(7)
    inv = discover(paths)
    dev = inv.device(7)
    assert not dev.present and len(inv.devices) == 16
    assert any(p.startswith("/sys/class/neuron_device/neuron7:") for p in dev.problems)
    assert any(p.startswith("/dev/neuron7:") for p in dev.problems)
    assert set(dev.connected) == {3, 4, 6, 11} and inv.topology.kind == "torus4x4"


def test_removed_device_on_an_unknown_type_is_remembered(tmp_path: Path) -> None:
    fake, paths = host(tmp_path, "inf2.24xlarge")
    fake.corrupt("/sys/class/dmi/id/product_name", "x9.mystery\n")
    fake.remove_neuron(5)
    assert len(discover(paths).devices) == 5
    inv = discover(paths, known=range(6))
    assert len(inv.devices) == 6 and not inv.device(5).present


def test_dev_node_missing_is_not_present(tmp_path: Path) -> None:
    fake, paths = host(tmp_path, "inf2.xlarge")
    fake.remove_dev_node("/dev/neuron0")
    dev = discover(paths).device(0)
    assert not dev.present and dev.problems == ("/dev/neuron0: missing",)


def test_uncorrected_counters_are_summed(tmp_path: Path) -> None:
    fake, paths = host(tmp_path, "trn1.2xlarge")
    fake.set_neuron_counter(0, "stats/hardware/mem_ecc_uncorrected/total", 2)
    fake.set_neuron_counter(0, "stats/hardware/sram_ecc_uncorrected/total", 1)
    fake.set_neuron_counter(0, "stats/hardware/mem_ecc_repairable_uncorrected/total", 5)
    assert discover(paths).device(0).uncorrected_errors == 3
    fake.set_neuron_counter(0, "stats/hardware/sram_ecc_uncorrected/total", "oops")
    dev = discover(paths).device(0)
    assert dev.uncorrected_errors == 2
    assert any("sram_ecc_uncorrected/total: expected an integer" in p for p in dev.problems)


def test_empty_host_root(tmp_path: Path) -> None:
    inv = discover(HostPaths(host_root=tmp_path))
    assert inv.devices == () and inv.total_logical_cores() == 0 and inv.topology.kind == "none"


def test_parse_connected() -> None:
    assert parse_connected("12, 3, 4, 1\n") == (12, 3, 4, 1)
    assert parse_connected("\n") == ()
    for bad in ("1,,x", "1, 1", "-1", "1.5"):
        with pytest.raises(ValueError):
            parse_connected(bad)


def test_parse_lnc() -> None:
    assert parse_lnc("NEURON_LOGICAL_NC_CONFIG=1\n") == 1
    assert parse_lnc("# comment\nexport NEURON_LOGICAL_NC_CONFIG='2'\n") == 2
    assert parse_lnc("1\n") == 1
    for bad in ("NEURON_LOGICAL_NC_CONFIG=3", "OTHER=1", "junk", ""):
        with pytest.raises(ValueError):
            parse_lnc(bad)
