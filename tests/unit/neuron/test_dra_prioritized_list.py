"""Prioritized lists (``firstAvailable``, GA): the allocation result names ``request/subrequest``, and an opaque
config may name the parent request or the chosen subrequest; either reaches the containers, and a config naming a
subrequest the allocator did not choose does not (resource.k8s.io/v1 DeviceAllocationConfiguration.requests:
"References to subrequests must include the name of the main request and may include the subrequest").

Facts: trn2.48xlarge has 8 physical NeuronCores per device: LNC 1 shows 8 per device, LNC 2 (the default) 4."""

from __future__ import annotations

from pathlib import Path

import pytest
from drarig import DriverRig, host_paths
from hostcache import shared_host

from neuron_dra.dra.profile import NeuronProfile

LNC1 = {"apiVersion": "neuron.aws.com/v1", "kind": "NeuronConfig", "logicalNeuronCore": 1}


def env_of_claim(tmp_path: Path, config_requests: list[str]) -> dict[str, str]:
    """Prepare a claim whose ``neurons`` request got its ``eight`` subrequest (devices 0-7), with an LNC 1 config
    naming ``config_requests``; the env its CDI spec gives the containers."""
    rig = DriverRig(host_paths(tmp_path, shared_host("trn2.48xlarge").root), NeuronProfile())
    ref = rig.add("eight-or-four", [f"neuron-device-{i}" for i in range(8)], uid="uid-1", request="neurons/eight",
                  configs=[{"source": "FromClaim", "requests": config_requests,
                            "opaque": {"driver": "neuron.aws.com", "parameters": LNC1}}])
    devices = rig.prepare_one(ref)
    assert [d.request_names for d in devices] == [("neurons",)] * 8, "containers name the parent request"
    spec = rig.cdi.read("uid-1")
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
