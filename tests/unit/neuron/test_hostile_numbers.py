"""Issue 14 item 1: odd digits in host files and names crash nothing, name the file and keep the other devices.

The inputs are the ones the issue reported (a port directory named ``²``, ``core_count`` = ``²``) plus full-width
and Arabic-Indic digits, which ``int()`` silently accepts.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
from hostcache import copy_host, own_paths

from accel_core.paths import HostPaths
from efa_plugin import cli as efa_cli
from efa_plugin.discovery import discover as discover_efa
from efa_plugin.metrics import EfaMetrics
from efa_plugin.policy import EfaPolicy
from neuron_dra.deviceplugin import cli as neuron_cli
from neuron_dra.deviceplugin.policy import parse_ids
from neuron_dra.discovery import discover as discover_neuron
from neuron_dra.dra import cli as dra_cli
from neuron_dra.dra.attributes import device_index


def test_efa_port_directory_named_superscript_two(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    host = copy_host(tmp_path / "host", "p4d.24xlarge")
    ports = host.ibdev_dir(host.efa_ibdevs[1]) / "ports"
    shutil.copytree(ports / "1", ports / "²")
    inv = discover_efa(HostPaths(host_root=host.root))
    assert len(inv.devices) == 4 and all(d.healthy for d in inv.devices)
    assert [p for p, _ in inv.devices[1].port_states] == [1]  # "²" is not a port
    assert efa_cli.main(["ls", "--host-root", str(host.root), "--output", "json"]) == 0
    assert json.loads(capsys.readouterr().out)["healthy"] == 4
    policy = EfaPolicy(own_paths(host))
    policy.rediscover()
    families = {m.name: m for m in EfaMetrics(policy)()}
    assert len(families["efa_port_active"].samples) == 4  # one port per device, no crash


def test_efa_counter_and_uverbs_with_unicode_digits(tmp_path: Path) -> None:
    host = copy_host(tmp_path / "host", "p4d.24xlarge")
    ibdev = host.efa_ibdevs[0]
    host.set_efa_counter(ibdev, "tx_bytes", 1, port=1)
    host.corrupt(f"{host.ibdev_dir(ibdev).relative_to(host.root)}/ports/1/hw_counters/tx_bytes", "１２\n")
    host.corrupt(f"{host.ibdev_dir(ibdev).relative_to(host.root)}/ports/1/hw_counters/rx_bytes", "²\n")
    verbs = host.path("/sys/class/infiniband_verbs")
    os.symlink(os.readlink(verbs / host.uverbs_of(ibdev)), verbs / "uverbs٣")  # int("٣") == 3
    paths = HostPaths(host_root=host.root)
    inv = discover_efa(paths)
    assert len(inv.devices) == 4  # "uverbs٣" is not a uverbs entry, so nothing is counted twice
    assert not any("uverbs٣" in s for s in inv.skipped)
    policy = EfaPolicy(paths)
    policy.rediscover()
    metrics = EfaMetrics(policy)
    families = {m.name: m for m in metrics()}
    for name in ("efa_port_tx_bytes", "efa_port_rx_bytes"):
        devices = {s.labels["device"] for s in families[name].samples}
        assert devices == set(host.efa_ibdevs) - {ibdev}  # the other devices keep their counters
    errors = {s.labels["device"]: s.value for s in families["efa_counter_read_errors"].samples}
    assert errors == {ibdev: 2}


def test_efa_numa_node_and_dev_with_odd_digits_are_device_problems(tmp_path: Path) -> None:
    host = copy_host(tmp_path / "host", "p4d.24xlarge")
    first, second = host.efa_ibdevs[:2]
    pci = host.path(f"/sys/class/infiniband/{first}/device").resolve()
    (pci / "numa_node").write_text("１\n")
    host.corrupt(f"/sys/class/infiniband_verbs/{host.uverbs_of(second)}/dev", "231:１９２\n")
    inv = discover_efa(HostPaths(host_root=host.root))
    by_ibdev = {d.ibdev: d for d in inv.devices}
    assert len(by_ibdev) == 4
    [numa_problem] = by_ibdev[first].problems
    assert numa_problem.startswith("/sys/devices/") and "numa_node: expected an integer" in numa_problem
    assert by_ibdev[first].numa_node is None
    [dev_problem] = by_ibdev[second].problems
    assert dev_problem.startswith(f"/sys/class/infiniband_verbs/{host.uverbs_of(second)}/dev (minor)")
    assert sum(d.healthy for d in inv.devices) == 2


@pytest.mark.parametrize("text", ["²\n", "１\n", "+2\n", "2 2\n"])
def test_neuron_core_count_with_odd_digits(tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str) -> None:
    host = copy_host(tmp_path / "host", "trn1.32xlarge")
    for index in range(host.neuron_count):
        host.set_neuron_counter(index, "core_count", text.strip())
    inv = discover_neuron(HostPaths(host_root=host.root))
    assert len(inv.devices) == 16
    assert all(d.core_count == 2 for d in inv.devices)  # trn1: 2 NeuronCores per device (the catalog's fallback)
    assert all(any(p.startswith(f"/sys/class/neuron_device/neuron{d.index}/core_count: expected a number")
                   for p in d.problems) for d in inv.devices)
    assert neuron_cli.main(["ls", "--host-root", str(host.root), "--output", "json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["resources"]["aws.amazon.com/neuroncore"] == 32
    assert dra_cli.main(["slices", "--host-root", str(host.root), "--node-name", "n1"]) == 0
    assert len(json.loads(capsys.readouterr().out)[0]["spec"]["devices"]) == 16


def test_neuron_counters_connected_devices_and_names_with_odd_digits(tmp_path: Path) -> None:
    host = copy_host(tmp_path / "host", "trn1.32xlarge")
    host.set_neuron_counter(3, "stats/hardware/mem_ecc_uncorrected/total", "٣")
    host.set_neuron_counter(4, "connected_devices", "１, 5")
    os.symlink("neuron1", host.path("/sys/class/neuron_device") / "neuron１")
    inv = discover_neuron(HostPaths(host_root=host.root))
    assert [d.index for d in inv.devices] == list(range(16))
    assert inv.device(3).uncorrected_errors == 0
    assert any("mem_ecc_uncorrected/total: expected an integer" in p for p in inv.device(3).problems)
    assert any(p.startswith("/sys/class/neuron_device/neuron4/connected_devices: expected")
               for p in inv.device(4).problems)
    assert inv.device(4).connected  # the catalog's links instead


def test_kubelet_and_claim_ids_with_odd_digits() -> None:
    with pytest.raises(Exception, match="is not a valid ID"):
        parse_ids(["²"], "aws.amazon.com/neuron", 16)
    with pytest.raises(Exception, match="is not a valid ID"):
        parse_ids(["１"], "aws.amazon.com/neuron", 16)
    assert parse_ids(["3", "0"], "aws.amazon.com/neuron", 16) == [3, 0]
    assert device_index("neuron-device-²") is None
    assert device_index("neuron-device-１") is None
    assert device_index("neuron-device-7") == 7
