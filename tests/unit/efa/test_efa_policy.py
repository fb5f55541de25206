"""EfaPolicy: advertised devices, Allocate edits, vanished devices, and one log line per problem."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import pytest
from hostcache import copy_host, own_paths

from accel_core.deviceplugin.daemon import DevicePluginService
from accel_core.deviceplugin.policy import AllocationError
from accel_core.fakehost import FakeHost
from accel_core.paths import HostPaths
from efa_plugin import RESOURCE_NAME, SOCKET_NAME
from efa_plugin.daemon import PLUGIN
from efa_plugin.policy import EfaPolicy


@pytest.fixture
def p5(tmp_path: Path) -> tuple[FakeHost, EfaPolicy]:
    host = copy_host(tmp_path / "host", "p5.48xlarge")
    policy = EfaPolicy(own_paths(host))
    assert policy.rediscover()
    return host, policy


def test_identity_and_advertised_devices(p5: tuple[FakeHost, EfaPolicy]) -> None:
    _, policy = p5
    assert (policy.resource_name, policy.socket_name) == (RESOURCE_NAME, SOCKET_NAME)
    assert policy.advertise_blocked() is None
    devices = policy.devices()
    assert len(devices) == 32 and all(d.healthy for d in devices)
    assert {d.numa_node for d in devices} == {0, 1}
    assert not policy.rediscover(), "an unchanged host is not a change"


def test_allocate_gives_only_the_uverbs_nodes(p5: tuple[FakeHost, EfaPolicy]) -> None:
    host, policy = p5
    ids = ["0000:4f:00.0", "0000:c9:00.0"]
    edits = policy.allocate(ids)
    want = [f"/dev/infiniband/{host.uverbs_of('rdmap79s0')}", f"/dev/infiniband/{host.uverbs_of('rdmap201s0')}"]
    assert [n.path for n in edits.device_nodes] == want
    assert all(n.permissions == "rw" and n.host_path is None for n in edits.device_nodes)
    assert edits.env == () and edits.mounts == () and edits.annotations == ()
    assert policy.allocation_counts["0000:4f:00.0"] == 1


def test_allocate_refuses_unknown_and_unhealthy(p5: tuple[FakeHost, EfaPolicy]) -> None:
    host, policy = p5
    with pytest.raises(AllocationError, match="'nope'"):
        policy.allocate(["0000:4f:00.0", "nope"])
    host.set_port_state("rdmap80s0", "DOWN")
    assert policy.rediscover()
    with pytest.raises(AllocationError, match=r"'0000:50:00.0' \(rdmap80s0\) is unhealthy: .*DOWN"):
        policy.allocate(["0000:50:00.0"])
    assert policy.allocation_counts == {}


def test_vanished_device_stays_advertised_unhealthy_until_back(p5: tuple[FakeHost, EfaPolicy]) -> None:
    host, policy = p5
    host.remove_efa("rdmap96s0")
    assert policy.rediscover()
    devices = {d.id: d for d in policy.devices()}
    assert len(devices) == 32
    assert not devices["0000:60:00.0"].healthy
    assert devices["0000:60:00.0"].numa_node == 0, "last known NUMA node kept"
    assert "gone" in policy.inventory.by_id["0000:60:00.0"].problems[0]
    host.restore_efa("rdmap96s0")
    assert policy.rediscover()
    assert all(d.healthy for d in policy.devices())


def test_allocation_follows_a_renumbered_uverbs(p5: tuple[FakeHost, EfaPolicy]) -> None:
    host, policy = p5
    # the kernel may hand a re-probed device another uverbs number: Allocate uses the one it sees now
    old = host.uverbs_of("rdmap79s0")
    verbs = host.path(f"/sys/class/infiniband_verbs/{old}")
    verbs.rename(verbs.with_name("uverbs40"))
    node = host.path(f"/dev/infiniband/{old}")
    node.rename(node.with_name("uverbs40"))
    policy.rediscover()
    assert [n.path for n in policy.allocate(["0000:4f:00.0"]).device_nodes] == ["/dev/infiniband/uverbs40"]


def test_problems_are_logged_once_and_recovery_once(p5: tuple[FakeHost, EfaPolicy],
                                                    caplog: pytest.LogCaptureFixture) -> None:
    host, policy = p5
    caplog.set_level(logging.INFO, logger="efa_plugin.policy")
    host.corrupt("/sys/bus/pci/devices/0000:50:00.0/numa_node", "x\n")
    for _ in range(3):
        policy.rediscover()
    bad = [r for r in caplog.records if r.getMessage() == "EFA device unhealthy"]
    assert len(bad) == 1
    assert "numa_node" in bad[0].kv["problem"]  # type: ignore[attr-defined]
    host.corrupt("/sys/bus/pci/devices/0000:50:00.0/numa_node", "0\n")
    policy.rediscover()
    policy.rediscover()
    assert len([r for r in caplog.records if r.getMessage() == "EFA problem cleared"]) == 1


def test_no_efa_node_says_so_once_and_picks_devices_up_later(tmp_path: Path,
                                                             caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="efa_plugin.policy")
    policy = EfaPolicy(HostPaths(host_root=tmp_path / "host"))
    for _ in range(3):
        policy.rediscover()
    lines = [r for r in caplog.records if r.getMessage().startswith("no EFA device on this node")]
    assert len(lines) == 1
    assert policy.devices() == []
    copy_host(tmp_path / "host", "p4d.24xlarge")
    assert policy.rediscover()
    assert len(policy.devices()) == 4


def test_watch_paths_cover_classes_dev_and_ports(p5: tuple[FakeHost, EfaPolicy]) -> None:
    host, policy = p5
    plugin = DevicePluginService(PLUGIN, policy.paths)
    plugin.profile = policy
    asyncio.run(plugin.rescan())
    # files, so that the watcher watches exactly their directories
    paths = plugin.watch_paths()
    assert host.path("/sys/class/infiniband_verbs/abi_version") in paths
    assert host.path("/dev/infiniband/rdma_cm") in paths
    assert host.ibdev_dir("rdmap79s0") / "ports" / "1" / "state" in paths
    # the EFA DRA driver's registration socket (coexistence guard): its directory is watched
    assert policy.paths.plugins_registry_dir / "efa.aws.com-reg.sock" in paths
    # and its presence file, which outlives a restart of its pod
    assert policy.paths.plugins_data_dir / "efa.aws.com" / "serving.json" in paths
    assert len(paths) == 4 + 32
    host.remove_efa("rdmap79s0")
    asyncio.run(plugin.rescan())
    assert len(plugin.watch_paths()) == 4 + 31


def test_preferred_uses_the_topology(p5: tuple[FakeHost, EfaPolicy]) -> None:
    _, policy = p5
    ids = [d.id for d in policy.devices()]
    got = policy.preferred(ids, [], 4)
    assert len({policy.topology.group_of[i] for i in got}) == 1
