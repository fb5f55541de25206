"""The one coexistence rule (accel_core.coexistence), both directions, through each accelerator's host scanner.

Expected values come from the kubelet's and the AWS plugins' socket names (docs in /work/shared/reference):
the AWS device plugins serve ``aws-efa-device-plugin.sock``, ``neuron-devplugin.sock`` and
``neuroncore-devplugin.sock`` in the device-plugins directory; a DRA driver registers ``<driver>-reg.sock``, or
``<driver>-<pod UID>-reg.sock`` with rolling updates, in the plugins registry; the kubelet's plugin watcher ignores
names starting with ``.`` and anything that is not a socket. These are the cases the three old guards disagreed on.
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from hostcache import copy_host

from accel_core.coexistence import Coexistence, remove_presence, write_presence
from accel_core.hostscan import held_device_plugin_ids, held_dra_devices
from accel_core.paths import HostPaths
from efa_plugin.scanner import EfaScanner
from neuron_dra.scanner import NeuronScanner

POD_UID = "3f1c2a9e-8d7b-4c6a-9e1f-0a2b3c4d5e6f"  # what the API server gives a pod (a UUID)
EFA = EfaScanner().coexistence
NEURON = NeuronScanner().coexistence


@pytest.fixture
def paths(short_tmp: Path) -> Iterator[HostPaths]:
    p = HostPaths(host_root=short_tmp / "h", kubelet_root=short_tmp / "k", device_plugins=short_tmp / "dp")
    p.device_plugins_dir.mkdir(parents=True)
    p.plugins_registry_dir.mkdir(parents=True)
    yield p


class Entries:
    """Directory entries of each kind, made and kept open (a bound socket) for one test."""

    def __init__(self, outside: Path) -> None:
        self.outside = outside
        self.socks: list[socket.socket] = []

    def make(self, directory: Path, name: str, kind: str) -> None:
        path = directory / name
        if kind == "socket":
            sock = socket.socket(socket.AF_UNIX)
            sock.bind(str(path))
            self.socks.append(sock)
        elif kind == "file":
            path.write_text("")
        elif kind == "dir":
            path.mkdir()
        elif kind == "symlink":  # to a live socket outside the directory
            target = self.outside / f"s{len(self.socks)}"
            self.make(self.outside, target.name, "socket")
            os.symlink(target, path)

    def close(self) -> None:
        for sock in self.socks:
            sock.close()


@pytest.fixture
def entries(short_tmp: Path) -> Iterator[Entries]:
    (short_tmp / "o").mkdir()
    made = Entries(short_tmp / "o")
    yield made
    made.close()


# the device plugin is running (the DRA driver notes it and serves anyway: the DRA driver wins)
@pytest.mark.parametrize(("guard", "name", "kind", "blocks"), [
    (EFA, "aws-efa-device-plugin.sock", "socket", True),
    (NEURON, "neuron-devplugin.sock", "socket", True),
    (NEURON, "neuroncore-devplugin.sock", "socket", True),
    (NEURON, "neuron-monitor.sock", "socket", False),  # not a Neuron device plugin socket (old: any *neuron*.sock)
    (NEURON, "my-neuron-plugin.sock", "socket", False),
    (NEURON, "kubelet.sock", "socket", False),
    (EFA, "neuron-devplugin.sock", "socket", False),  # the other accelerator's plugin
    (NEURON, "neuron-devplugin.sock", "file", False),  # not a socket: no plugin serves it
    (NEURON, "neuron-devplugin.sock", "dir", False),
    (NEURON, "neuron-devplugin.sock", "symlink", False),  # never followed out of the directory (old: followed)
    (NEURON, ".neuron-devplugin.sock", "socket", False),
    (EFA, "aws-efa-device-plugin.sock", "file", False),
])
def test_device_plugin_running(paths: HostPaths, entries: Entries, guard: Coexistence, name: str, kind: str,
                               blocks: bool) -> None:
    entries.make(paths.device_plugins_dir, name, kind)
    note = guard.dra_sharing_note(paths)
    assert (note is not None) == blocks, note
    if note:
        assert name in note and str(paths.device_plugins_dir) in note
    assert guard.device_plugin_blocked(paths) is None


# the DRA driver is registered (the device plugin steps aside)
@pytest.mark.parametrize(("guard", "name", "kind", "blocks"), [
    (NEURON, "neuron.aws.com-reg.sock", "socket", True),
    (NEURON, f"neuron.aws.com-{POD_UID}-reg.sock", "socket", True),
    (EFA, "efa.aws.com-reg.sock", "socket", True),
    (EFA, f"efa.aws.com-{POD_UID}-reg.sock", "socket", True),
    (NEURON, "neuron.aws.comx-reg.sock", "socket", False),  # another driver's name (old Neuron guard: no '-')
    (NEURON, "neuron.aws.com.eu-reg.sock", "socket", False),
    (NEURON, "neuron.aws.com--reg.sock", "socket", False),  # an empty pod UID is none
    (NEURON, "neuron.aws.com-reg.sock.tmp", "socket", False),
    (NEURON, "efa.aws.com-reg.sock", "socket", False),  # the other accelerator's driver
    (EFA, "efa.aws.com-reg.sock", "file", False),  # not a socket: the kubelet ignores it (old: counted)
    (NEURON, f"neuron.aws.com-{POD_UID}-reg.sock", "file", False),
    (NEURON, "neuron.aws.com-reg.sock", "dir", False),
    (NEURON, "neuron.aws.com-reg.sock", "symlink", False),
    (NEURON, ".neuron.aws.com-reg.sock", "socket", False),
])
def test_dra_driver_registered(paths: HostPaths, entries: Entries, guard: Coexistence, name: str, kind: str,
                               blocks: bool) -> None:
    entries.make(paths.plugins_registry_dir, name, kind)
    reason = guard.device_plugin_blocked(paths)
    assert (reason is not None) == blocks, reason
    if reason:
        assert str(paths.plugins_registry_dir / name) in reason
    assert guard.dra_sharing_note(paths) is None


@pytest.mark.parametrize("kind", ["socket", "file", "dir", "symlink"])
def test_one_rule_both_ways(paths: HostPaths, entries: Entries, kind: str) -> None:
    """The same kind of entry counts, or not, in both directions."""
    entries.make(paths.device_plugins_dir, "neuron-devplugin.sock", kind)
    entries.make(paths.plugins_registry_dir, "neuron.aws.com-reg.sock", kind)
    assert (NEURON.dra_sharing_note(paths) is None) == (NEURON.device_plugin_blocked(paths) is None) == (
        kind != "socket")


def test_missing_directories_block_nothing(tmp_path: Path) -> None:
    paths = HostPaths(host_root=tmp_path / "h", kubelet_root=tmp_path / "nowhere", device_plugins=tmp_path / "no")
    assert EFA.dra_sharing_note(paths) is None and EFA.device_plugin_blocked(paths) is None


def test_each_side_watches_the_other_ones_directory(paths: HostPaths) -> None:
    """As files in them, so a socket appearing under any name (a pod UID) wakes the other daemon."""
    assert NEURON.dra_watch_path(paths).parent == paths.device_plugins_dir
    registry_file, presence = NEURON.device_plugin_watch_paths(paths)
    assert registry_file.parent == paths.plugins_registry_dir
    assert presence == paths.plugins_data_dir / "neuron.aws.com" / "serving.json"


# -- the presence file: the DRA driver is there across a restart of its pod ----------------------------------------
def _presence(paths: HostPaths, guard: Coexistence, age: float) -> Path:
    path = guard.presence_file(paths)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_presence(path, pod_uid=POD_UID, node="n1")
    then = time.time() - age
    os.utime(path, (then, then))
    return path


@pytest.mark.parametrize(("age", "blocks"), [(0.0, True), (44.0, True), (46.0, False), (3600.0, False)])
def test_a_restarting_driver_keeps_the_device_plugin_down_for_the_lease(paths: HostPaths, age: float,
                                                                         blocks: bool) -> None:
    """No registration socket (the pod is being re-created), a presence file refreshed ``age`` seconds ago, and the
    default 45 s lease: the device plugin stays down inside the lease and takes over after it."""
    path = _presence(paths, NEURON, age)
    reason = NEURON.device_plugin_blocked(paths)
    assert (reason is not None) == blocks, reason
    if reason:
        assert "restarting" in reason and str(path) in reason
        left = NEURON.lease_left(paths)
        assert left is not None and 45.0 - age - 2 < left <= 45.0 - age + 0.01
    else:
        assert NEURON.lease_left(paths) is None
    assert EFA.device_plugin_blocked(paths) is None  # another accelerator's driver


def test_a_registered_driver_blocks_whatever_its_presence_file_says(paths: HostPaths, entries: Entries) -> None:
    _presence(paths, NEURON, 3600.0)  # stale
    entries.make(paths.plugins_registry_dir, "neuron.aws.com-reg.sock", "socket")
    assert "registered" in str(NEURON.device_plugin_blocked(paths))
    assert NEURON.lease_left(paths) is None  # the socket decides: no lease to wait out


@pytest.mark.parametrize("kind", ["dir", "symlink", "fifo"])
def test_only_a_regular_presence_file_counts(paths: HostPaths, short_tmp: Path, kind: str) -> None:
    path = NEURON.presence_file(paths)
    path.parent.mkdir(parents=True)
    if kind == "dir":
        path.mkdir()
    elif kind == "symlink":  # to a fresh regular file outside: never followed
        target = short_tmp / "fresh.json"
        target.write_text("{}")
        os.symlink(target, path)
    else:
        os.mkfifo(path)
    assert NEURON.presence_age(paths) is None and NEURON.device_plugin_blocked(paths) is None


def test_a_presence_file_from_the_future_counts_as_just_refreshed(paths: HostPaths) -> None:
    """A clock step backwards must not make the file look older than it is, nor hold the plugin down forever:
    its age is 0 and the lease still ends 45 s after the file's time has been reached."""
    _presence(paths, EFA, -600.0)
    assert EFA.presence_age(paths) == 0.0
    assert EFA.lease_left(paths) == pytest.approx(45.0, abs=0.5)


def test_leaving_removes_the_file_and_the_device_plugin_serves_at_once(paths: HostPaths) -> None:
    path = _presence(paths, EFA, 0.0)
    assert EFA.device_plugin_blocked(paths) is not None
    assert remove_presence(path) and not remove_presence(path)
    assert EFA.device_plugin_blocked(paths) is None


# -- the same hardware on both sides ---------------------------------------------------------------------------------
def test_neuron_chip_and_its_cores_are_one_dra_device(short_tmp: Path) -> None:
    """trn2.48xlarge: 16 chips of 8 NeuronCores, LNC 2 by default, so 4 logical cores per chip; the AWS device
    plugin's neuroncore ID is device index * logical cores per device + local core (neuron.md)."""
    host = copy_host(short_tmp / "h", "trn2.48xlarge")
    scanner = NeuronScanner()
    ids = scanner.device_plugin_ids(scanner.scan(HostPaths(host_root=host.root)).inventory)
    assert len(ids) == 16
    assert ids["neuron-device-3"] == (("aws.amazon.com/neuron", "3"), ("aws.amazon.com/neuroncore", "12"),
                                      ("aws.amazon.com/neuroncore", "13"), ("aws.amazon.com/neuroncore", "14"),
                                      ("aws.amazon.com/neuroncore", "15"))
    # a pod holding core 13 holds chip 3 for DRA; a DRA claim on chip 3 holds neuron 3 and cores 12-15
    assert held_dra_devices(ids, {"aws.amazon.com/neuroncore": {"13"}}) == {"neuron-device-3"}
    assert held_device_plugin_ids(ids, ["neuron-device-3"]) == {"aws.amazon.com/neuron": {"3"},
                                                              "aws.amazon.com/neuroncore": {"12", "13", "14", "15"}}
    assert held_dra_devices(ids, {"aws.amazon.com/neuron": {"99"}, "vpc.amazonaws.com/efa": {"3"}}) == set()


def test_an_efa_is_one_device_on_both_sides(short_tmp: Path) -> None:
    host = copy_host(short_tmp / "h", "p5.48xlarge")
    scanner = EfaScanner()
    inv = scanner.scan(HostPaths(host_root=host.root)).inventory
    ids = scanner.device_plugin_ids(inv)
    assert len(ids) == 32  # p5.48xlarge: 32 EFA interfaces (efa.md)
    first = inv.devices[0]
    (name, pairs), = ((n, p) for n, p in ids.items() if p == (("vpc.amazonaws.com/efa", first.id),))
    assert name.startswith("efa-") and held_dra_devices(ids, {"vpc.amazonaws.com/efa": {first.id}}) == {name}
