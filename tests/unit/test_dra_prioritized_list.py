"""Prioritized lists (``firstAvailable``, GA): the allocation result names ``request/subrequest``, and an opaque
config may name the parent request or the chosen subrequest; either reaches the containers, and a config naming a
subrequest the allocator did not choose does not (resource.k8s.io/v1 DeviceAllocationConfiguration.requests:
"References to subrequests must include the name of the main request and may include the subrequest").

Facts: trn2.48xlarge has 8 physical NeuronCores per device: LNC 1 shows 8 per device, LNC 2 (the default) 4."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import msgspec
import pytest
from dracalls import prepare_one
from hostcache import shared_host
from lightkube.resources.resource_v1 import ResourceClaim

from accel_core.dra.cdi import CdiSpecWriter
from accel_core.dra.checkpoint import read_boot_id
from accel_core.dra.preparation import CDI_CLASS, DraDriver, cdi_vendor
from accel_core.dra.store import ClaimStore
from accel_core.dra.types import ClaimRef
from accel_core.paths import HostPaths
from neuron_dra.dra.profile import NeuronProfile

NODE = "node-a"
LNC1 = {"apiVersion": "neuron.aws.com/v1", "kind": "NeuronConfig", "logicalNeuronCore": 1}


def env_of_claim(tmp_path: Path, config_requests: list[str]) -> dict[str, str]:
    """Prepare a claim whose ``neurons`` request got its ``eight`` subrequest (devices 0-7), with an LNC 1 config
    naming ``config_requests``; the env its CDI spec gives the containers."""
    host = shared_host("trn2.48xlarge")
    paths = HostPaths(host_root=host.root, kubelet_root=tmp_path / "kubelet", cdi_root=tmp_path / "cdi",
                      device_plugins=tmp_path / "kubelet" / "device-plugins")
    claim: dict[str, Any] = {
        "metadata": {"namespace": "ns", "name": "eight-or-four", "uid": "uid-1"},
        "status": {"allocation": {"devices": {
            "results": [{"request": "neurons/eight", "driver": "neuron.aws.com", "pool": NODE,
                         "device": f"neuron-device-{i}"} for i in range(8)],
            "config": [{"source": "FromClaim", "requests": config_requests,
                        "opaque": {"driver": "neuron.aws.com", "parameters": LNC1}}]}}}}

    class Reader:
        async def read(self, namespace: str, name: str) -> ResourceClaim | None:
            return msgspec.convert(claim, ResourceClaim)

    profile = NeuronProfile()
    inventory = profile.scan(paths, "1.0.0").inventory
    store = ClaimStore(paths.plugins_data_dir / "neuron.aws.com" / "checkpoint.json", read_boot_id(host.root))
    store.load()
    cdi = CdiSpecWriter(paths.cdi_root, cdi_vendor("neuron.aws.com"), CDI_CLASS)
    driver = DraDriver(profile, node_name=NODE, reader=Reader(), cdi=cdi, store=store, inventory=lambda: inventory)
    devices = prepare_one(driver, ClaimRef("ns", "uid-1", "eight-or-four"))
    assert [d.request_names for d in devices] == [("neurons",)] * 8, "containers name the parent request"
    spec = cdi.read("uid-1")
    assert spec is not None
    return dict(e.split("=", 1) for d in spec["devices"] for e in d["containerEdits"].get("env", []))


@pytest.mark.parametrize("names", [["neurons"], ["neurons/eight"]], ids=["parent", "subrequest"])
def test_config_naming_the_parent_or_the_chosen_subrequest_reaches_the_containers(tmp_path: Path,
                                                                                  names: list[str]) -> None:
    env = env_of_claim(tmp_path, names)
    assert env["NEURON_LOGICAL_NC_CONFIG"] == "1"
    assert env["NEURON_RT_VISIBLE_CORES"] == "0-63"  # 8 devices x 8 cores at LNC 1


def test_config_naming_a_subrequest_not_chosen_does_not_apply(tmp_path: Path) -> None:
    env = env_of_claim(tmp_path, ["neurons/four"])
    assert "NEURON_LOGICAL_NC_CONFIG" not in env
    assert env["NEURON_RT_VISIBLE_CORES"] == "0-31"  # 8 devices x 4 cores at the default LNC 2
