"""Discovery over sysfs listings of real instances, written down file by file from the Neuron driver's sysfs
interface as ../shared/reference/neuron.md section 1.3 describes it (not produced by the project's fake-host builder).

Each listing maps a host path to its content; ``->`` marks a symlink. ``core_count`` has no trailing newline and
``connected_devices`` is a comma+space list ending in a newline (an empty line when a device has no neighbours).

The second half checks the fake hosts the instance catalog builds against real ``neuron-ls`` listings
(tests/neuron_listings.py): PCI addresses, NUMA nodes and neighbours come from those listings, not from the catalog.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from hostcache import shared_host
from neuron_listings import (
    INF2_48XLARGE_BLOG,
    TRN1_32XLARGE_HYPERPOD,
    TRN1_32XLARGE_SDK,
    TRN2_48XLARGE_DEVICE_13,
    TRN2_48XLARGE_GUIDE,
    Row,
    bus,
)

from accel_core.paths import HostPaths
from neuron_dra.discovery import discover

Listing = dict[str, str]

# trn1.32xlarge neuron-ls "CONNECTED DEVICES" / connected_devices, driver order (up, left, down, right).
TRN1_CONNECTED = ["12, 3, 4, 1", "13, 0, 5, 2", "14, 1, 6, 3", "15, 2, 7, 0", "0, 7, 8, 5", "1, 4, 9, 6",
                  "2, 5, 10, 7", "3, 6, 11, 4", "4, 11, 12, 9", "5, 8, 13, 10", "6, 9, 14, 11", "7, 10, 15, 8",
                  "8, 15, 0, 13", "9, 12, 1, 14", "10, 13, 2, 15", "11, 14, 3, 12"]


def _device(index: int, core_count: str, connected: str, arch_type: str, instance_type: str,
            device_name: str) -> Listing:
    real = f"/sys/devices/virtual/neuron_device/neuron{index}"
    return {
        f"/sys/class/neuron_device/neuron{index}": f"-> ../../devices/virtual/neuron_device/neuron{index}",
        f"{real}/core_count": core_count,
        f"{real}/connected_devices": connected + "\n",
        f"{real}/info/architecture/arch_type": arch_type + "\n",
        f"{real}/info/architecture/instance_type": instance_type + "\n",
        f"{real}/info/architecture/device_name": device_name + "\n",
        f"/dev/neuron{index}": "",
    }


# The kernel module's MODULE_VERSION (driver 2.24.7.0, the release neuron.md was written from).
DRIVER = {"/sys/module/neuron/version": "2.24.7.0\n"}

TRN1_32XLARGE: Listing = {"/sys/class/dmi/id/product_name": "trn1.32xlarge\n", **DRIVER}
for _i, _links in enumerate(TRN1_CONNECTED):
    TRN1_32XLARGE |= _device(_i, "2", _links, "NDv2", "Trn1", "Trainium1")

INF2_XLARGE: Listing = {"/sys/class/dmi/id/product_name": "inf2.xlarge\n", **DRIVER,
                        **_device(0, "2", "", "NDv3", "Inf2", "Inferentia2")}

TRN2_3XLARGE_LNC1: Listing = {"/sys/class/dmi/id/product_name": "trn2.3xlarge\n", **DRIVER,
                              "/opt/aws/neuron/logical_nc_config": "NEURON_LOGICAL_NC_CONFIG=1\n",
                              **_device(0, "8", "", "NDv3", "Trn2", "Trainium2")}


def materialize(listing: Listing, root: Path) -> HostPaths:
    for host_path, content in listing.items():
        target = root / host_path.lstrip("/")
        target.parent.mkdir(parents=True, exist_ok=True)
        if content.startswith("-> "):
            target.symlink_to(content.removeprefix("-> "))
        else:
            target.write_text(content)
    return HostPaths(host_root=root)


def test_trn1_32xlarge(tmp_path: Path) -> None:
    inv = discover(materialize(TRN1_32XLARGE, tmp_path))
    assert inv.all_problems() == [] and inv.driver_version == "2.24.7.0"
    assert [d.index for d in inv.devices] == list(range(16))
    assert {d.core_count for d in inv.devices} == {2} and inv.total_logical_cores() == 32
    assert [d.connected for d in inv.devices] == [tuple(int(x) for x in s.split(", ")) for s in TRN1_CONNECTED]
    assert {(d.arch, d.device_name) for d in inv.devices} == {("trn1", "Trainium1")}
    assert inv.topology.kind == "torus4x4" and inv.topology.source == "connected_devices"
    assert inv.device(5).dev_node == "/dev/neuron5" and inv.device(5).present


@pytest.mark.parametrize(("listing", "arch", "cores"), [(INF2_XLARGE, "inf2", 2), (TRN2_3XLARGE_LNC1, "trn2", 8)])
def test_single_device_instances(tmp_path: Path, listing: Listing, arch: str, cores: int) -> None:
    inv = discover(materialize(listing, tmp_path))
    assert inv.all_problems() == []
    (dev,) = inv.devices
    assert (dev.arch, dev.connected, inv.total_logical_cores()) == (arch, (), cores)
    assert inv.topology.kind == "single"


def test_trn2_3xlarge_default_lnc_halves_the_cores(tmp_path: Path) -> None:
    listing = dict(TRN2_3XLARGE_LNC1)
    del listing["/opt/aws/neuron/logical_nc_config"]
    inv = discover(materialize(listing, tmp_path))
    assert (inv.device(0).core_count, inv.lnc, inv.total_logical_cores()) == (8, 2, 4)


# -- the catalog's fake hosts against real neuron-ls listings (tests/neuron_listings.py) -----------------------------


def _rows(instance_type: str, root: Path) -> dict[int, tuple[tuple[int, ...], str | None, int | None]]:
    inv = discover(HostPaths(host_root=shared_host(instance_type).root))
    assert inv.all_problems() == []
    return {d.index: (d.connected, d.pci_address, d.numa_node) for d in inv.devices}


def test_trn2_48xlarge_addresses_numa_and_neighbours(tmp_path: Path) -> None:
    rows = _rows("trn2.48xlarge", tmp_path)
    assert sorted(rows) == sorted(TRN2_48XLARGE_GUIDE)
    for index, (links, bdf, numa) in TRN2_48XLARGE_GUIDE.items():
        ours, our_bdf, our_numa = rows[index]
        assert (our_bdf, our_numa, set(ours)) == (bdf, numa, set(links)), index
    assert rows[13] == TRN2_48XLARGE_DEVICE_13  # order too, as a real trn2.48xlarge prints it


@pytest.mark.parametrize("listing", [TRN1_32XLARGE_HYPERPOD, TRN1_32XLARGE_SDK], ids=["hyperpod", "sdk"])
def test_trn1_32xlarge_buses_numa_and_neighbours(tmp_path: Path, listing: dict[int, Row]) -> None:
    rows = _rows("trn1.32xlarge", tmp_path)
    assert sorted(rows) == sorted(listing)
    for index, (links, bdf, numa) in listing.items():
        ours, our_bdf, our_numa = rows[index]
        assert ours == links, index
        assert our_bdf is not None and bus(our_bdf) == bus(bdf), index  # the slot within a bus differs per instance
        assert numa is None or our_numa == numa, index
    assert {r[1] for r in rows.values()} == {r[1] for r in listing.values()}


def test_inf2_48xlarge_buses_and_ring(tmp_path: Path) -> None:
    rows = _rows("inf2.48xlarge", tmp_path)
    assert sorted(rows) == sorted(INF2_48XLARGE_BLOG)
    for index, (links, bdf, _) in INF2_48XLARGE_BLOG.items():
        ours, our_bdf, _ = rows[index]
        assert ours == links and our_bdf is not None and bus(our_bdf) == bus(bdf), index
    assert {r[1] for r in rows.values()} == {r[1] for r in INF2_48XLARGE_BLOG.values()}


def test_trn1_listings_agree_on_buses_and_differ_in_slots() -> None:
    """Why the trn1 test compares buses: two real trn1.32xlarge instances put the same index on the same bus."""
    hyper, sdk = TRN1_32XLARGE_HYPERPOD, TRN1_32XLARGE_SDK
    assert all(bus(hyper[i][1]) == bus(sdk[i][1]) for i in hyper)
    assert any(hyper[i][1] != sdk[i][1] for i in hyper)
