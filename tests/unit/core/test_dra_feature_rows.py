"""What docs/dra-kubernetes-1.37.md says each driver does with the 1.37 beta DRA features, checked on what the
drivers publish (the real ``slices`` command on fake hosts) and on the claim reporter:

- partitionable devices: Neuron publishes shared counters (UltraServer ``neuron-chips``; per-core counters with
  ``--core-devices on``) in slices of their own, and devices that consume them; EFA publishes none;
- consumable capacity: no device of either driver allows multiple allocations or has a capacity to share;
- binding conditions: no device of either driver has binding conditions (local PCI devices, ready at bind);
- workload claims: a claim reserved for something other than a Pod (a PodGroup) gets no pod Event.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from drarig import claim as api_claim
from lightkube.resources.resource_v1 import ResourceClaim

from accel_core.dra.claimreport import problem_of
from accel_core.fakehost import build_host
from efa_plugin.dra import cli as efa_cli
from neuron_dra.dra import cli as neuron_cli

SHARING_FIELDS = ("allowMultipleAllocations", "bindingConditions", "bindingFailureConditions", "bindsToNode")


def published(tmp: Path, capsys: pytest.CaptureFixture[str], main: Any, instance_type: str, *flags: str,
              **host: Any) -> list[dict[str, Any]]:
    root = tmp / instance_type
    build_host(root, instance_type, **host)
    assert main(["slices", "--host-root", str(root), "--node-name", "n1", *flags]) == 0
    slices: list[dict[str, Any]] = json.loads(capsys.readouterr().out)
    return slices


@pytest.mark.parametrize(("driver", "instance_type", "flags", "host"), [
    ("neuron", "trn2.48xlarge", (), {}),
    ("neuron", "trn2.48xlarge", ("--core-devices", "on"), {}),
    ("neuron", "trn2u.48xlarge", (), {"ultraserver_id": "a", "ultraserver_node": 0}),
    ("efa", "p5.48xlarge", (), {}),
    ("efa", "trn2.48xlarge", (), {}),
])
def test_partitionable_yes_consumable_capacity_and_binding_conditions_no(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], driver: str, instance_type: str,
        flags: tuple[str, ...], host: dict[str, Any]) -> None:
    main = neuron_cli.main if driver == "neuron" else efa_cli.main
    slices = published(tmp_path, capsys, main, instance_type, *flags, **host)
    devices = [d for s in slices for d in s["spec"].get("devices") or []]
    assert devices
    for d in devices:
        assert not set(SHARING_FIELDS) & set(d), d["name"]
        assert all("requestPolicy" not in c for c in (d.get("capacity") or {}).values()), d["name"]
    counter_slices = [s for s in slices if s["spec"].get("sharedCounters")]
    consumers = [d for d in devices if d.get("consumesCounters")]
    partitioned = driver == "neuron" and (flags or host)
    assert bool(counter_slices) == bool(consumers) == bool(partitioned)
    for s in counter_slices:  # a slice holds counters or devices, never both
        assert not s["spec"].get("devices")


def test_a_claim_reserved_for_a_workload_gets_no_pod_event() -> None:
    claim = ResourceClaim.from_dict(api_claim("c", ["neuron-device-0"], driver="neuron.aws.com", uid="u1", pool="n1",
                                              reserved=[{"apiGroup": "scheduling.k8s.io", "resource": "podgroups",
                                                         "name": "g", "uid": "g1"},
                                                        {"resource": "pods", "name": "p", "uid": "p1"}]))
    problem = problem_of(claim, "u1", driver="neuron.aws.com", pool="n1", reason="InvalidConfig", cause="x")
    assert problem is not None and [p.name for p in problem.pods] == ["p"]
