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
from collections.abc import Iterator
from pathlib import Path

import pytest

from accel_core.coexistence import Coexistence
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


# the device plugin is running (the DRA driver steps aside)
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
    reason = guard.dra_blocked(paths)
    assert (reason is not None) == blocks, reason
    if reason:
        assert name in reason and str(paths.device_plugins_dir) in reason
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
    assert guard.dra_blocked(paths) is None


@pytest.mark.parametrize("kind", ["socket", "file", "dir", "symlink"])
def test_one_rule_both_ways(paths: HostPaths, entries: Entries, kind: str) -> None:
    """The same kind of entry counts, or not, in both directions."""
    entries.make(paths.device_plugins_dir, "neuron-devplugin.sock", kind)
    entries.make(paths.plugins_registry_dir, "neuron.aws.com-reg.sock", kind)
    assert (NEURON.dra_blocked(paths) is None) == (NEURON.device_plugin_blocked(paths) is None) == (kind != "socket")


def test_missing_directories_block_nothing(tmp_path: Path) -> None:
    paths = HostPaths(host_root=tmp_path / "h", kubelet_root=tmp_path / "nowhere", device_plugins=tmp_path / "no")
    assert EFA.dra_blocked(paths) is None and EFA.device_plugin_blocked(paths) is None


def test_each_side_watches_the_other_ones_directory(paths: HostPaths) -> None:
    """As files in them, so a socket appearing under any name (a pod UID) wakes the other daemon."""
    assert NEURON.dra_watch_path(paths).parent == paths.device_plugins_dir
    assert NEURON.device_plugin_watch_path(paths).parent == paths.plugins_registry_dir
