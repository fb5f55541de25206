"""Neuron device-plugin policies without sockets: IDs, Allocate edits, no double counting, health, guard, metrics."""

from __future__ import annotations

import socket
from dataclasses import replace
from pathlib import Path

import pytest
from hostcache import copy_host
from prometheus_client import CollectorRegistry, generate_latest

from accel_core.deviceplugin import AllocationError
from accel_core.fakehost import FakeHost
from accel_core.health import DeviceHealth, Problem, ProblemKind
from accel_core.metrics import CallbackCollector
from accel_core.paths import HostPaths
from neuron_dra.deviceplugin import NeuronCorePolicy, NeuronDevicePolicy, NeuronNode
from neuron_dra.deviceplugin.cli import main
from neuron_dra.deviceplugin.daemon import NeuronPlugin
from neuron_dra.deviceplugin.inuse import NEURON, NEURONCORE, UsageTracker
from neuron_dra.deviceplugin.metrics import NeuronMetrics
from neuron_dra.deviceplugin.options import ServeOptions
from neuron_dra.deviceplugin.podresources import in_use_from
from neuron_dra.deviceplugin.start import service
from neuron_dra.discovery import discover
from neuron_dra.dra.profile import NeuronProfile
from neuron_dra.health_rule import device_health


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def make(tmp_path: Path, itype: str, lnc: int | None = None, clock: Clock | None = None
         ) -> tuple[FakeHost, NeuronNode, NeuronDevicePolicy, NeuronCorePolicy]:
    fake = copy_host(tmp_path / "host", itype, lnc=lnc)
    paths = HostPaths(host_root=fake.root, kubelet_root=tmp_path / "kubelet",
                      device_plugins=tmp_path / "kubelet" / "device-plugins")
    node = NeuronNode(paths, grace=30.0, clock=clock or Clock())
    node.rediscover()
    return fake, node, NeuronDevicePolicy(node), NeuronCorePolicy(node)


def unhealthy(policy: NeuronDevicePolicy | NeuronCorePolicy) -> set[str]:
    return {d.id for d in policy.devices() if not d.healthy}


def test_ids_and_numa(tmp_path: Path) -> None:
    _, _, dev, core = make(tmp_path, "trn1.32xlarge")
    devices = dev.devices()
    assert [d.id for d in devices] == [str(i) for i in range(16)]
    assert devices[2].numa_node == 1 and devices[0].numa_node == 0
    cores = core.devices()
    assert [c.id for c in cores] == [str(i) for i in range(32)]
    assert cores[5].numa_node == devices[2].numa_node
    assert dev.socket_name == "neuron-devplugin.sock" and core.socket_name == "neuroncore-devplugin.sock"


def test_allocate_devices_gives_nodes_and_container_cores(tmp_path: Path) -> None:
    _, _, dev, _ = make(tmp_path, "trn2.3xlarge", lnc=1)
    edits = dev.allocate(["0"])
    assert [(n.path, n.host_path) for n in edits.device_nodes] == [("/dev/neuron0", "/dev/neuron0")]
    assert edits.env_dict() == {"NEURON_RT_VISIBLE_CORES": "0-7", "NEURON_LOGICAL_NC_CONFIG": "1"}


def test_allocate_cores_renumbers_for_the_container(tmp_path: Path) -> None:
    _, _, _, core = make(tmp_path, "trn1.32xlarge")
    edits = core.allocate(["9", "10"])  # device 4 core 1, device 5 core 0 (2 cores per device)
    assert [n.path for n in edits.device_nodes] == ["/dev/neuron4", "/dev/neuron5"]
    assert edits.env_dict() == {"NEURON_RT_VISIBLE_CORES": "1-2"}


def test_bad_ids_are_refused(tmp_path: Path) -> None:
    _, _, dev, core = make(tmp_path, "inf2.xlarge")
    with pytest.raises(AllocationError, match="'1' is not a valid ID"):
        dev.allocate(["1"])
    with pytest.raises(AllocationError, match="'x'"):
        core.preferred(["0", "x"], [], 1)


def test_no_double_counting_from_allocate(tmp_path: Path) -> None:
    _, node, dev, core = make(tmp_path, "trn1.32xlarge")
    dev.allocate(["3"])
    assert unhealthy(core) == {"6", "7"} and unhealthy(dev) == set()
    with pytest.raises(AllocationError, match="devices \\[3\\] are in use through aws.amazon.com/neuron"):
        core.allocate(["6"])
    core.allocate(["10"])  # device 5
    assert unhealthy(dev) == {"5"}
    with pytest.raises(AllocationError, match="device 5 has cores \\[10\\] in use"):
        dev.allocate(["5"])
    # preferred steers clear of the other resource's devices even when the kubelet offers them
    offered = [str(i) for i in range(32) if i != 10]
    assert core.preferred(offered, [], 1) == ["11"]  # packs next to core 10
    assert core.preferred(offered, [], 2) == ["0", "1"]
    assert not {"6", "7"} & set(core.preferred(offered, [], 24))
    assert "5" not in dev.preferred([str(i) for i in range(16)], [], 4)
    assert node.conflicts() == set()


def test_pod_resources_confirms_and_frees(tmp_path: Path) -> None:
    clock = Clock()
    _, node, dev, core = make(tmp_path, "trn1.32xlarge", clock=clock)
    dev.allocate(["3"])
    assert node.usage.apply_list({NEURON: ["3"]}) is False  # confirmed: nothing changes
    assert node.usage.pending_count() == 0
    assert node.usage.apply_list({}) is True  # the pod is gone
    assert unhealthy(core) == set()
    # a List naming core IDs held elsewhere (e.g. before a plugin restart) marks the device
    node.usage.apply_list({NEURONCORE: ["30"]})
    assert unhealthy(dev) == {"15"}


def test_unconfirmed_allocation_expires_only_while_list_works(tmp_path: Path) -> None:
    clock = Clock()
    _, node, dev, core = make(tmp_path, "trn1.32xlarge", clock=clock)
    dev.allocate(["0"])
    clock.now += 10
    node.usage.apply_list({})
    assert unhealthy(core) == {"0", "1"}  # within the grace period
    clock.now += 60
    node.usage.list_failed()
    assert unhealthy(core) == {"0", "1"}  # List down: kept
    assert node.usage.apply_list({}) is True
    assert unhealthy(core) == set()


def test_usage_notifies_on_allocate(tmp_path: Path) -> None:
    _, node, dev, _ = make(tmp_path, "inf2.xlarge")
    calls: list[int] = []
    node.on_change = lambda: calls.append(1)
    dev.allocate(["0"])
    assert calls == [1]


def test_in_use_from_pod_resources_response() -> None:
    from accel_core.kubeletapi import podresources_v1_pb2 as pr
    resp = pr.ListPodResourcesResponse(pod_resources=[pr.PodResources(name="a", namespace="n", containers=[
        pr.ContainerResources(name="c", devices=[
            pr.ContainerDevices(resource_name=NEURON, device_ids=["1", "2"]),
            pr.ContainerDevices(resource_name="vpc.amazonaws.com/efa", device_ids=["x"])]),
        pr.ContainerResources(name="d", devices=[pr.ContainerDevices(resource_name=NEURONCORE, device_ids=["9"])]),
    ])])
    assert in_use_from(resp) == {NEURON: {"1", "2"}, NEURONCORE: {"9"}}


def test_usage_tracker_multiple_records() -> None:
    clock = Clock()
    usage = UsageTracker(grace=5, clock=clock)
    usage.record_allocate(NEURON, ["1"])
    usage.record_allocate(NEURON, ["2"])
    usage.apply_list({NEURON: ["1"]})
    assert usage.in_use(NEURON) == {"1", "2"}
    clock.now += 6
    usage.apply_list({NEURON: ["1"]})
    assert usage.in_use(NEURON) == {"1"}


# ----------------------------------------------------------------------------------------------- health


def test_health_follows_sysfs_dev_node_and_ecc(tmp_path: Path) -> None:
    fake, node, dev, core = make(tmp_path, "inf2.48xlarge")
    fake.remove_neuron(2)
    node.rediscover()
    assert unhealthy(dev) == {"2"} and unhealthy(core) == {"4", "5"}
    assert node.health.get(2).reason == "DeviceMissing" and "neuron2" in node.health.get(2).message
    fake.restore_neuron(2)
    node.rediscover()
    assert unhealthy(dev) == set() and unhealthy(core) == set()
    fake.remove_dev_node("/dev/neuron7")
    node.rediscover()
    assert unhealthy(dev) == {"7"}
    fake.restore_dev_node("/dev/neuron7")
    fake.set_neuron_counter(1, "stats/hardware/mem_ecc_uncorrected/total", 3)
    node.rediscover()
    assert unhealthy(dev) == {"1"} and node.health.get(1).reason == "UncorrectedErrors"
    assert "3 uncorrected ECC errors" in node.health.get(1).message
    fake.set_neuron_counter(1, "stats/hardware/mem_ecc_uncorrected/total", 0)
    node.rediscover()
    assert unhealthy(dev) == set()


def test_one_rule_for_the_device_plugin_and_the_dra_driver(tmp_path: Path) -> None:
    """Issue 14 item 11: both daemons see the same health, a restart forgives nothing, and only a reset of the
    counters (driver reload or reboot) heals a device with uncorrected errors."""
    fake = copy_host(tmp_path / "host", "trn1.2xlarge")
    paths = HostPaths(host_root=fake.root, kubelet_root=tmp_path / "k",
                      device_plugins=tmp_path / "k" / "device-plugins")
    fake.set_neuron_counter(0, "stats/hardware/sram_ecc_uncorrected/total", 4)  # errors from before either started

    def both() -> tuple[DeviceHealth, DeviceHealth]:
        node = NeuronNode(paths)  # a fresh start of the device plugin
        node.rediscover()
        return node.health.get(0), NeuronProfile().scan(paths, "0.1.0").health["neuron-device-0"]

    plugin, dra = both()
    assert plugin == dra and (plugin.healthy, plugin.reason) == (False, "UncorrectedErrors")
    fake.set_neuron_counter(0, "stats/hardware/sram_ecc_uncorrected/total", 0)  # the driver reloaded
    plugin, dra = both()
    assert plugin == dra == DeviceHealth(True)
    fake.remove_dev_node("/dev/neuron0")
    plugin, dra = both()
    assert plugin == dra and plugin.reason == "DevNodeMissing"


def test_both_daemons_poll_each_present_devices_uncorrected_counters(tmp_path: Path) -> None:
    fake, node, _, _ = make(tmp_path, "trn2.48xlarge")
    profile, options = NeuronProfile(), ServeOptions()
    plugin = service(node.paths, options)
    plugin.profile = NeuronPlugin(plugin, options, node)

    def polled() -> list[str]:
        files = profile.scanner.health_files(node.paths, profile.scan(node.paths, "0.1.0").inventory)
        assert files == plugin.look()[1], "the device plugin and the DRA driver poll the same files"
        return [f.relative_to(fake.root).as_posix() for f in files]

    files = polled()
    # 16 Trainium2 devices, each with a memory and an SRAM uncorrected-error counter (a directory with a total)
    assert len(files) == 32
    assert files[:2] == ["sys/class/neuron_device/neuron0/stats/hardware/mem_ecc_uncorrected/total",
                         "sys/class/neuron_device/neuron0/stats/hardware/sram_ecc_uncorrected/total"]
    fake.remove_neuron(3)
    files = polled()
    assert len(files) == 30 and not any("/neuron3/" in f for f in files), "nothing to poll on a vanished device"


def test_the_rule_reads_problem_kinds_not_messages(tmp_path: Path) -> None:
    inv = discover(HostPaths(host_root=copy_host(tmp_path / "host", "inf2.xlarge").root))
    dev = inv.devices[0]
    assert device_health(replace(dev, problems=("/dev/neuron0: missing",))).healthy, "plain text is informational"
    odd = replace(dev, problems=(Problem("/dev/neuron0: gone away", ProblemKind.DEV_NODE_MISSING),))
    assert device_health(odd).reason == "DevNodeMissing"


# ----------------------------------------------------------------------------------------------- guard


def test_guard(short_tmp: Path) -> None:
    """The device plugin side of the one rule (accel_core.coexistence; tests/unit/core/test_coexistence.py has its edge
    cases): a registration socket blocks both resources, and the reason names it."""
    _, node, dev, core = make(short_tmp, "inf2.xlarge")
    registry = node.paths.plugins_registry_dir
    registry.mkdir(parents=True)
    assert dev.advertise_blocked() is None
    with socket.socket(socket.AF_UNIX) as sock:
        sock.bind(str(registry / "neuron.aws.com-reg.sock"))
        reason = core.advertise_blocked()
        assert reason is not None and str(registry / "neuron.aws.com-reg.sock") in reason
        assert dev.advertise_blocked() is not None
    (registry / "neuron.aws.com-reg.sock").unlink()
    assert dev.advertise_blocked() is None


# ----------------------------------------------------------------------------------------------- metrics and ls


def test_metrics_use_neuron_monitor_names(tmp_path: Path) -> None:
    fake, node, dev, _ = make(tmp_path, "trn2.3xlarge")
    fake.set_neuron_counter(0, "stats/hardware/mem_ecc_uncorrected/total", 2)
    fake.set_neuron_counter(0, "neuron_core3/stats/status/hw_error/total", 7)
    fake.set_neuron_counter(0, "neuron_core3/stats/memory_usage/device_mem/tensors/present", 100)
    fake.set_neuron_counter(0, "neuron_core2/stats/memory_usage/device_mem/tensors/present", 20)
    node.rediscover()
    dev.allocate(["0"])
    registry = CollectorRegistry()
    registry.register(CallbackCollector(NeuronMetrics(node).produce))
    text = generate_latest(registry).decode()
    assert 'neurondevice_hw_ecc_events_total{event_type="mem_ecc_uncorrected",neuron_device_index="0"} 2.0' in text
    assert 'neuron_device_plugin_core_status_total{neuron_device_index="0",physical_core="3",status="hw_error"} 7.0' \
        in text
    # physical cores 2 and 3 form logical core 1 at LNC 2
    assert 'neuroncore_memory_usage_tensors{memory_location="device_mem",neuroncore="1"} 120.0' in text
    assert 'neuron_device_plugin_device_memory_used_bytes{neuron_device_index="0"} 120.0' in text
    assert 'neuron_device_plugin_device_healthy{neuron_device_index="0"} 0.0' in text  # ECC rose after start
    assert 'neuron_device_plugin_ids_in_use{resource="aws.amazon.com/neuron"} 1.0' in text
    assert 'neuron_device_plugin_ids_withheld{resource="aws.amazon.com/neuroncore"} 4.0' in text
    assert 'lnc="2"' in text and 'topology="single"' in text


def test_ls_table_looks_like_neuron_ls(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    fake = copy_host(tmp_path / "host", "inf2.xlarge")
    assert main(["ls", "--host-root", str(fake.root)]) == 0
    out = capsys.readouterr().out
    assert "instance-type: inf2.xlarge" in out
    assert "| NEURON | NEURON | NEURON | CONNECTED | PCI     | NUMA |" in out
    assert "| 0      | 2      | 32 GB  |           | 00:1f.0 | -    |" in out
    assert "aws.amazon.com/neuron=1 aws.amazon.com/neuroncore=2" in out


def test_ls_without_hardware(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    fake = copy_host(tmp_path / "host", "c5.large")
    assert main(["ls", "--host-root", str(fake.root)]) == 0
    out = capsys.readouterr().out
    assert "no Neuron devices found" in out and "aws.amazon.com/neuron=0 aws.amazon.com/neuroncore=0" in out


def test_sizes_beyond_the_node_are_refused(tmp_path: Path) -> None:
    """Issue 25 item 3: the policies bound the size by the node too, not only the server."""
    _, _, dev, core = make(tmp_path, "trn1.32xlarge")
    everything = [str(i) for i in range(16)]
    for size in (17, 10**6, -1):
        with pytest.raises(AllocationError, match=f"allocation size {size} is not within the 16 IDs"):
            dev.preferred(everything, [], size)
    with pytest.raises(AllocationError, match="allocation size 33 is not within the 32 IDs"):
        core.preferred([str(i) for i in range(32)], [], 33)


def test_a_vanished_device_keeps_its_numa_node_in_both_daemons(tmp_path: Path) -> None:
    """One memory of seen devices (neuron_dra.scanner): the device plugin advertises a vanished device with the
    NUMA node it had, as the DRA driver publishes it, so its topology hint stays put while it is gone."""
    fake, node, dev, _ = make(tmp_path, "trn2.48xlarge")
    pci = node.inventory.device(2).pci_address
    numa = int((fake.root / f"sys/bus/pci/devices/{pci}/numa_node").read_text())  # the host's own answer
    profile = NeuronProfile()
    profile.scan(node.paths, "0.1.0")
    fake.remove_neuron(2)
    node.rediscover()
    advertised = {d.id: d for d in dev.devices()}["2"]
    assert not advertised.healthy and advertised.numa_node == numa
    assert profile.scan(node.paths, "0.1.0").inventory.device(2).numa_node == numa
