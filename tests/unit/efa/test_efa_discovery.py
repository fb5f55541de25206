"""EFA discovery on fake hosts of every catalog type, and on broken hosts."""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path

import hostcache
import pytest
from hostcache import copy_host

from accel_core.awsfacts import catalog
from accel_core.fakehost import FakeHost
from accel_core.paths import HostPaths
from efa_plugin import RESOURCE_NAME, cli
from efa_plugin.discovery import EfaInventory, discover
from efa_plugin.facts import efa_count, neuron_efa_map
from efa_plugin.neuron_map import neuron_table

SharedHost = Callable[..., tuple[FakeHost, HostPaths]]

# issue 4, "Counts": what `ls --output json` must print per type (types the issue does not name: the catalog)
EXPECTED = {
    "p4d.24xlarge": 4,
    "p5.48xlarge": 32,
    "p5en.48xlarge": 16,
    "p6-b200.48xlarge": 8,
    "trn1.32xlarge": 8,
    "trn1n.32xlarge": 16,
    "trn2.48xlarge": 16,
    "c5.large": 0,
}


def host_of(tmp_path: Path, instance_type: str, efa: bool = True) -> tuple[FakeHost, HostPaths]:
    """A fresh host tree that the test may change."""
    host = copy_host(tmp_path / "host", instance_type, efa=efa)
    return host, HostPaths(host_root=host.root)


@pytest.fixture
def shared_host() -> SharedHost:
    """Read-only host trees, built once per session (tests/hostcache.py; the Trainium trees take seconds)."""

    def get(instance_type: str, efa: bool = True) -> tuple[FakeHost, HostPaths]:
        host = hostcache.shared_host(instance_type, efa=efa)
        return host, HostPaths(host_root=host.root)

    return get


def ls_json(paths: HostPaths, capsys: pytest.CaptureFixture[str]) -> dict[str, object]:
    assert cli.main(["ls", "--host-root", str(paths.host_root), "--output", "json"]) == 0
    out: dict[str, object] = json.loads(capsys.readouterr().out)
    return out


@pytest.mark.parametrize("instance_type", catalog.names())
def test_ls_counts_every_catalog_type(
    instance_type: str, shared_host: SharedHost, capsys: pytest.CaptureFixture[str]
) -> None:
    host, paths = shared_host(instance_type)
    doc = ls_json(paths, capsys)
    expected = EXPECTED.get(instance_type, efa_count(catalog.get(instance_type)))
    assert doc["resources"] == {RESOURCE_NAME: expected}
    devices = doc["devices"]
    assert isinstance(devices, list) and len(devices) == expected
    assert {d["ibdev"] for d in devices} == set(host.efa_ibdevs)
    assert all(d["healthy"] and d["port_state"] == "ACTIVE" for d in devices)
    assert doc["skipped"] == []


@pytest.mark.parametrize("instance_type", catalog.names())
def test_no_efa_variant_counts_zero(
    instance_type: str, shared_host: SharedHost, capsys: pytest.CaptureFixture[str]
) -> None:
    host, paths = shared_host(instance_type, efa=False)
    doc = ls_json(paths, capsys)
    assert doc["resources"] == {RESOURCE_NAME: 0}
    assert doc["devices"] == []
    # non-EFA RDMA devices remain on the host and are listed as ignored, never counted
    ignored = doc["ignored"]
    assert isinstance(ignored, list)
    assert sorted(i["ibdev"] for i in ignored) == sorted(host.rdma_ibdevs)


def test_p6_b200_ibp_devices_are_not_efa(shared_host: SharedHost) -> None:
    host, paths = shared_host("p6-b200.48xlarge")
    inv = discover(paths)
    assert len(host.rdma_ibdevs) == 10
    assert len(inv.devices) == 8
    assert sorted(i.ibdev for i in inv.ignored) == ["ibp115s0f0", "ibp116s0f0"]
    assert all("mlx5_core" in i.reason for i in inv.ignored)
    # the ibp* devices hold uverbs0/1; EFAs are mapped through ibdev, not numbering
    assert sorted(d.uverbs for d in inv.devices) == sorted(f"uverbs{i}" for i in range(2, 10))
    assert all(d.ibdev.startswith("rdmap") for d in inv.devices)


def test_p5_device_record(shared_host: SharedHost) -> None:
    host, paths = shared_host("p5.48xlarge")
    inv = discover(paths)
    dev = inv.by_id["0000:4f:00.0"]
    assert dev.ibdev == "rdmap79s0"
    assert dev.uverbs == host.uverbs_of("rdmap79s0")
    assert dev.device_node == f"/dev/infiniband/{dev.uverbs}"
    assert (dev.major, dev.minor) == (231, 192 + int(dev.uverbs[6:]))
    assert dev.pcie_root == "pci0000:44"
    assert dev.numa_node == 0
    assert dev.port_states == ((1, "ACTIVE"),)
    assert dev.near_gpus == ("0000:53:00.0",)
    assert dev.healthy
    roots: dict[str | None, int] = {}
    for d in inv.devices:
        roots[d.pcie_root] = roots.get(d.pcie_root, 0) + 1
        assert len(d.id) <= 63
    assert sorted(roots.values()) == [4] * 8
    assert {d.numa_node for d in inv.devices} == {0, 1}


def test_ids_are_stable_and_deterministic(shared_host: SharedHost) -> None:
    _, paths = shared_host("trn2.48xlarge")
    first, second = discover(paths), discover(paths)
    assert first == second
    assert [d.id for d in first.devices] == sorted(d.id for d in first.devices)


def test_kernel_efa_names_and_no_numa(shared_host: SharedHost) -> None:
    _, paths = shared_host("trn2.3xlarge")
    (dev,) = discover(paths).devices
    assert dev.ibdev == "efa_0"
    assert dev.numa_node is None  # numa_node -1
    assert dev.id == "0000:00:06.0"


@pytest.mark.parametrize("instance_type", ["trn1.32xlarge", "trn1n.32xlarge", "trn2.48xlarge", "trn2u.48xlarge"])
def test_neuron_proximity_matches_mapping_tables(instance_type: str, shared_host: SharedHost) -> None:
    _, paths = shared_host(instance_type)
    inv = discover(paths)
    expected = neuron_efa_map(catalog.get(instance_type))  # neuron index -> EFA BDF
    got = {n: d.pci_address for d in inv.devices for n in d.near_neurons}
    assert got == expected
    assert sorted(got) == list(range(16))


def test_neuron_table_needs_a_listed_type() -> None:
    assert neuron_table("trn1.32xlarge")["0000:10:1a.0"] == (0, 1)
    assert neuron_table("trn2.3xlarge") == {}
    assert neuron_table("p5.48xlarge") == {}
    assert neuron_table(None) == {}


def test_p4d_one_efa_per_root_next_to_two_gpus(shared_host: SharedHost) -> None:
    _, paths = shared_host("p4d.24xlarge")
    inv = discover(paths)
    assert [len(d.near_gpus) for d in inv.devices] == [2, 2, 2, 2]
    assert len({d.pcie_root for d in inv.devices}) == 4


# ------------------------------------------------------------------------------------------------ bad input


def only(inv: EfaInventory, ibdev: str) -> list[str]:
    return [p for d in inv.devices if d.ibdev == ibdev for p in d.problems]


def test_non_numeric_numa_node_marks_unhealthy_naming_path(tmp_path: Path) -> None:
    host, paths = host_of(tmp_path, "p5.48xlarge")
    host.corrupt("/sys/bus/pci/devices/0000:50:00.0/numa_node", "banana\n")
    inv = discover(paths)
    assert len(inv.devices) == 32
    dev = inv.by_id["0000:50:00.0"]
    assert not dev.healthy and dev.numa_node is None
    assert "numa_node" in dev.problems[0] and "banana" in dev.problems[0]
    assert "/sys/devices/pci0000:44" in dev.problems[0]
    assert sum(not d.healthy for d in inv.devices) == 1


def test_dangling_ibdev_class_link_skips_entry(tmp_path: Path) -> None:
    host, paths = host_of(tmp_path, "p5.48xlarge")
    shutil.rmtree(host.ibdev_dir("rdmap80s0"))  # class link now dangles
    inv = discover(paths)
    assert len(inv.devices) == 31
    uverbs = host.uverbs_of("rdmap80s0")
    (problem,) = inv.skipped
    assert f"/sys/class/infiniband_verbs/{uverbs}" in problem and "dangling" in problem


def test_dangling_device_link_skips_entry(tmp_path: Path) -> None:
    host, paths = host_of(tmp_path, "p4d.24xlarge")
    link = host.ibdev_dir("rdmap16s27") / "device"
    link.unlink()
    link.symlink_to("../../nowhere")
    inv = discover(paths)
    assert len(inv.devices) == 3
    assert inv.skipped == ("/sys/class/infiniband/rdmap16s27/device: a dangling link; cannot find the PCI function; "
                           "entry skipped",)


def test_uverbs_without_infiniband_device_is_skipped(tmp_path: Path) -> None:
    host, paths = host_of(tmp_path, "p4d.24xlarge")
    host.write("/sys/class/infiniband_verbs/uverbs9/ibdev", "rdmap99s9\n")
    inv = discover(paths)
    assert len(inv.devices) == 4
    (problem,) = inv.skipped
    assert "/sys/class/infiniband_verbs/uverbs9" in problem and "rdmap99s9" in problem


def test_unreadable_ibdev_attribute_is_skipped(tmp_path: Path) -> None:
    host, paths = host_of(tmp_path, "p4d.24xlarge")
    attr = host.path("/sys/class/infiniband_verbs/uverbs0") / "ibdev"
    attr.unlink()
    attr.mkdir()  # reading it fails (EISDIR), which root cannot be denied
    inv = discover(paths)
    assert len(inv.devices) == 3
    assert "/sys/class/infiniband_verbs/uverbs0/ibdev: unreadable" in inv.skipped[0]


def test_port_down_and_missing_device_node_are_unhealthy(tmp_path: Path) -> None:
    host, paths = host_of(tmp_path, "p5en.48xlarge")
    host.set_port_state("rdmap85s0", "DOWN")
    host.remove_dev_node(f"/dev/infiniband/{host.uverbs_of('rdmap86s0')}")
    inv = discover(paths)
    assert only(inv, "rdmap85s0") == ["/sys/class/infiniband/rdmap85s0/ports/1/state: port is DOWN, not ACTIVE"]
    assert only(inv, "rdmap86s0") == [f"/dev/infiniband/{host.uverbs_of('rdmap86s0')}: device node missing"]
    assert sum(d.healthy for d in inv.devices) == 14
    host.set_port_state("rdmap85s0", "ACTIVE")
    host.restore_dev_node(f"/dev/infiniband/{host.uverbs_of('rdmap86s0')}")
    assert all(d.healthy for d in discover(paths).devices)


def test_removed_device_disappears_from_discovery(tmp_path: Path) -> None:
    host, paths = host_of(tmp_path, "p5.48xlarge")
    host.remove_efa("rdmap96s0")
    assert "0000:60:00.0" not in discover(paths).by_id
    host.restore_efa("rdmap96s0")
    assert discover(paths).by_id["0000:60:00.0"].healthy


def test_garbage_everywhere_never_raises(tmp_path: Path) -> None:
    host, paths = host_of(tmp_path, "p5.48xlarge")
    host.corrupt(f"/sys/class/infiniband_verbs/{host.uverbs_of('rdmap81s0')}/dev", "\xff\xfe not a dev\n")
    host.corrupt("/sys/class/infiniband/rdmap82s0/ports/1/state", "")
    host.corrupt("/sys/bus/pci/devices/0000:60:00.0/vendor", "zzz")
    host.write("/sys/class/infiniband_verbs/uverbs77/ibdev", "../../etc\n")
    os.unlink(host.path("/sys/class/infiniband/rdmap113s0/ports/1/state"))
    inv = discover(paths)
    assert len(inv.devices) == 32  # the driver link still says efa for 0000:60:00.0
    assert inv.by_id["0000:51:00.0"].major is None
    assert not inv.by_id["0000:52:00.0"].healthy
    assert "ports/1/state: missing" in inv.by_id["0000:71:00.0"].problems[0]
    assert any("uverbs77" in s for s in inv.skipped)


def test_missing_sysfs_classes_mean_no_devices(tmp_path: Path) -> None:
    inv = discover(HostPaths(host_root=tmp_path))
    assert inv == EfaInventory()


def test_table_output_for_people(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    host, paths = host_of(tmp_path, "p6-b200.48xlarge")
    host.set_port_state("rdmap80s0", "DOWN")
    assert cli.main(["ls", "--host-root", str(paths.host_root)]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"{RESOURCE_NAME}: 8 (7 healthy)")
    assert "rdmap79s0" in out and "Unhealthy" in out
    assert "ignored: ibp115s0f0" in out
    assert "problem: 0000:50:00.0 (rdmap80s0)" in out
