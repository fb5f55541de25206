"""Two NeuronCores of one chip in one container: each core device's CDI entry names its chip's ``/dev/neuron<i>``
(neuron_dra/dra/profile.py), so the runtime gets the same device node from two CDI devices. containerd's own CDI
library (``tools/cdicheck``, upstream ``pkg/cdi``) must load such a spec and inject the node once, with the request's
``NEURON_RT_VISIBLE_CORES`` naming both cores."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from cdi_oracle import assert_cdi_accepts
from hostcache import shared_host

from accel_core.dra.cdi import CdiSpecWriter
from accel_core.edits import ContainerEdits
from accel_core.paths import HostPaths
from neuron_dra.dra.config import NeuronConfig
from neuron_dra.dra.profile import NeuronProfile

pytestmark = pytest.mark.gotools  # tools/cdicheck, built from Go

NEURON_MAJOR = 239  # any char major: the fake host has no /dev/neuron4 for the library to stat


def test_two_cores_of_one_chip_inject_its_device_node_once(tmp_path: Path) -> None:
    profile = NeuronProfile(core_devices="on")
    inv = profile.scan(HostPaths(host_root=shared_host("trn2.48xlarge").root), "0.1.0").inventory
    cores = ["neuron-device-4-core-1", "neuron-device-4-core-2"]
    out = profile.container_edits(inv, "cores", cores, NeuronConfig())

    def with_numbers(edits: ContainerEdits) -> ContainerEdits:
        return dataclasses.replace(edits, device_nodes=tuple(
            dataclasses.replace(n, major=NEURON_MAJOR, minor=int(n.path.removeprefix("/dev/neuron")))
            for n in edits.device_nodes))

    writer = CdiSpecWriter(tmp_path, "k8s.neuron.aws.com", "claim")
    writer.write("u-1", [*((f"u-1-{c}", with_numbers(out.devices[c])) for c in cores),
                         ("u-1-request-cores", out.request)])
    ids = [f"k8s.neuron.aws.com/claim=u-1-{c}" for c in cores] + ["k8s.neuron.aws.com/claim=u-1-request-cores"]
    report = assert_cdi_accepts(tmp_path, ids, inject=True)
    assert report.injected is not None
    assert report.injected["env"] == ["NEURON_RT_VISIBLE_CORES=1-2"]
    assert report.injected["devices"] == [{"path": "/dev/neuron4", "type": "c", "major": NEURON_MAJOR, "minor": 4}]
