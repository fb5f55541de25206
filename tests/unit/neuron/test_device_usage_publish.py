"""The device plugin's device-usage annotation: what it says after Allocate and PodResources, and that a new
generation is written only when something changed. trn1.32xlarge: 16 devices in a 4x4 torus, 2 logical cores per
device (AWS instance facts)."""

from __future__ import annotations

from pathlib import Path

from accel_core.fakehost import build_host
from accel_core.ownnode import OwnNode
from accel_core.paths import HostPaths
from neuron_dra.deviceplugin import NeuronCorePolicy, NeuronDevicePolicy, NeuronNode
from neuron_dra.deviceplugin.inuse import NEURON, NEURONCORE
from neuron_dra.deviceplugin.publish import UsagePublisher
from neuron_dra.usage_annotation import USAGE_ANNOTATION, parse_usage


def test_allocate_and_pod_resources_reach_the_annotation(tmp_path: Path) -> None:
    fake = build_host(tmp_path / "host", "trn1.32xlarge")
    node = NeuronNode(HostPaths(host_root=fake.root, kubelet_root=tmp_path / "k",
                                device_plugins=tmp_path / "k" / "device-plugins"))
    node.rediscover()
    own = OwnNode(None, "n")
    publisher = UsagePublisher(node, own, clock=lambda: 5.0)
    node.on_change = publisher.publish
    publisher.publish()

    def current() -> str:
        value = own.wanted()[1][USAGE_ANNOTATION]
        assert value is not None
        return value

    first = parse_usage(current())
    assert (first.topology_kind, first.devices, first.cores_per_device) == ("torus4x4", 16, 2)
    assert (first.neuron, first.neuroncore, first.generation) == (frozenset(), frozenset(), 1)

    NeuronDevicePolicy(node).allocate(["4", "5"])
    NeuronCorePolicy(node).allocate(["0", "1"])
    after = parse_usage(current())
    assert after.neuron == {4, 5} and after.neuroncore == {0, 1} and after.pending == 2
    assert after.generation == 3  # one per change

    # PodResources attributes them to pods; the pending Allocates are confirmed.
    node.usage.apply_list({NEURON: ["4", "5"], NEURONCORE: ["0", "1"]},
                          {"ns/a": {NEURON: ["4", "5"]}, "ns/b": {NEURONCORE: ["0", "1"]}})
    publisher.publish()
    listed = parse_usage(current())
    assert listed.pods == {"ns/a": {"neuron": (4, 5), "neuroncore": ()},
                           "ns/b": {"neuron": (), "neuroncore": (0, 1)}}
    assert listed.pending == 0
    gen = listed.generation
    publisher.publish()  # nothing changed: no new generation
    assert parse_usage(current()).generation == gen
