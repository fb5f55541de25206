"""DevicePluginService's two rules that every device plugin shares: udev is followed on a real host only, and a
policy's health is the scan's (no policy runs a health rule of its own)."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import pytest
from hostcache import copy_host, own_paths

from accel_core.deviceplugin.policy import AllocationError
from accel_core.health import DeviceHealth
from accel_core.hostscan import udev_subsystems
from accel_core.paths import HostPaths
from efa_plugin.policy import EfaPolicy
from efa_plugin.scanner import EfaScanner
from neuron_dra.deviceplugin import NeuronCorePolicy, NeuronDevicePolicy, NeuronNode

FAULT = DeviceHealth(False, "Fault", "reported by the scan")


def test_udev_only_on_a_real_host(tmp_path: Path) -> None:
    scanner = EfaScanner()
    assert udev_subsystems(scanner, HostPaths(host_root=Path("/"))) == ("infiniband", "infiniband_verbs")
    os.symlink("/", tmp_path / "root")  # the host's root through a link is still the real host
    assert udev_subsystems(scanner, HostPaths(host_root=tmp_path / "root")) == ("infiniband", "infiniband_verbs")
    (tmp_path / "fake").mkdir()  # a fake tree: the machine's own udev events say nothing about it
    assert udev_subsystems(scanner, HostPaths(host_root=tmp_path / "fake")) == ()


def test_efa_policy_advertises_and_allocates_by_the_scans_health(tmp_path: Path) -> None:
    host = copy_host(tmp_path / "host", "p4d.24xlarge")
    policy = EfaPolicy(own_paths(host))
    scan = policy.scanner.scan(policy.paths)
    first = scan.inventory.devices[0].id
    assert all(h.healthy for h in scan.health.values())  # nothing wrong on the host itself
    policy.update(dataclasses.replace(scan, health={**scan.health, first: FAULT}))
    assert [d.id for d in policy.devices() if not d.healthy] == [first]
    with pytest.raises(AllocationError, match="reported by the scan"):
        policy.allocate([first])


def test_neuron_policies_advertise_by_the_scans_health(tmp_path: Path) -> None:
    host = copy_host(tmp_path / "host", "inf2.24xlarge")  # 6 Inferentia2 chips of 2 cores
    node = NeuronNode(HostPaths(host_root=host.root, kubelet_root=tmp_path / "kubelet"))
    scan = node.scanner.scan(node.paths)
    node.update(dataclasses.replace(scan, health={**scan.health, "2": FAULT}))
    assert [d.id for d in NeuronDevicePolicy(node).devices() if not d.healthy] == ["2"]
    assert [d.id for d in NeuronCorePolicy(node).devices() if not d.healthy] == ["4", "5"]
