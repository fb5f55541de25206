"""Admin access (``adminAccess: true`` in the allocation result, GA since Kubernetes 1.36) through the core handler,
for both drivers: a monitoring claim is prepared beside the workload on the same devices in either order, holds no
device, survives a restart in the checkpoint, and unpreparing either claim leaves the other intact.

The rule comes from the ResourceClaim API (resource.k8s.io/v1 DeviceRequestAllocationResult.adminAccess): claims
with admin access "ignore all ordinary claims to the device with respect to access modes and any resource
allocations"."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from drarig import DriverRig, host_paths
from hostcache import shared_host

from accel_core.dra.profile import DraProfile
from accel_core.dra.types import ClaimError, ClaimRef
from efa_plugin.dra.profile import EfaProfile
from neuron_dra.dra.profile import NeuronProfile

# Each driver on a fake host of its kind; a claim takes the first two devices of the published pool.
DRIVERS: dict[str, tuple[str, Callable[[], DraProfile[Any, Any]]]] = {
    "neuron.aws.com": ("trn2.48xlarge", NeuronProfile), "efa.aws.com": ("p5.48xlarge", EfaProfile)}


class Rig(DriverRig):
    def __init__(self, tmp_path: Path, driver: str) -> None:
        instance_type, profile_type = DRIVERS[driver]
        super().__init__(host_paths(tmp_path, shared_host(instance_type).root), profile_type())
        self.devices = self.devices[:2]

    def claim(self, name: str, *, admin: bool, devices: list[str] | None = None) -> ClaimRef:
        return self.add(name, devices or self.devices, request="all" if admin else "work", admin=admin)

    def prepare_devices(self, ref: ClaimRef) -> list[str]:
        return [d.device for d in self.prepare_one(ref)]


@pytest.fixture(params=sorted(DRIVERS))
def rig(request: pytest.FixtureRequest, tmp_path: Path) -> Rig:
    return Rig(tmp_path, request.param)


@pytest.mark.parametrize("admin_first", [True, False], ids=["admin-first", "workload-first"])
def test_admin_claim_is_prepared_beside_the_workload_in_either_order(rig: Rig, admin_first: bool) -> None:
    admin, work = rig.claim("watch-all", admin=True), rig.claim("eight-or-four", admin=False)
    for ref in ([admin, work] if admin_first else [work, admin]):
        assert rig.prepare_devices(ref) == rig.devices
    assert rig.cdi.exists(admin.uid) and rig.cdi.exists(work.uid)


def test_admin_claim_does_not_let_two_workloads_share_a_device(rig: Rig) -> None:
    rig.prepare_devices(rig.claim("watch-all", admin=True))
    rig.prepare_devices(rig.claim("first", admin=False))
    with pytest.raises(ClaimError, match=f"device {rig.devices[0]} is already prepared for claim ns/first"):
        rig.prepare_devices(rig.claim("second", admin=False))


def test_two_admin_claims_share_devices(rig: Rig) -> None:
    assert rig.prepare_devices(rig.claim("watch-a", admin=True)) == rig.devices
    assert rig.prepare_devices(rig.claim("watch-b", admin=True)) == rig.devices


@pytest.mark.parametrize("gone", ["admin", "work"])
def test_unprepare_of_either_leaves_the_other_intact(rig: Rig, gone: str) -> None:
    refs = {"admin": rig.claim("watch-all", admin=True), "work": rig.claim("eight-or-four", admin=False)}
    for ref in refs.values():
        rig.prepare_devices(ref)
    rig.unprepare_one(refs[gone])
    kept = refs["work" if gone == "admin" else "admin"]
    assert not rig.cdi.exists(refs[gone].uid) and rig.store.get(refs[gone].uid) is None
    assert rig.cdi.exists(kept.uid) and rig.store.get(kept.uid) is not None
    rig.restart()
    assert rig.store.get(kept.uid) is not None and rig.store.get(refs[gone].uid) is None


def test_admin_access_survives_a_restart(rig: Rig) -> None:
    admin = rig.claim("watch-all", admin=True)
    rig.prepare_devices(admin)
    rig.restart()  # a new process reads the checkpoint (snapshot and journal) from disk
    entry = rig.store.get(admin.uid)
    assert entry is not None and [r.admin_access for r in entry.requests] == [True]
    assert entry.held_devices == ()
    assert rig.prepare_devices(rig.claim("work", admin=False)) == rig.devices  # still holds nothing after the restart
    assert [r.admin_access for r in rig.store.get(admin.uid).requests] == [True]  # type: ignore[union-attr]


def test_checkpoint_entry_names_admin_access_only_when_set(rig: Rig) -> None:
    admin, work = rig.claim("watch-all", admin=True), rig.claim("work", admin=False)
    rig.prepare_devices(admin)
    rig.prepare_devices(work)
    admin_entry, work_entry = rig.store.get(admin.uid), rig.store.get(work.uid)
    assert admin_entry is not None and work_entry is not None
    assert [r.get("adminAccess") for r in admin_entry.to_json()["requests"]] == [True]
    assert all("adminAccess" not in r for r in work_entry.to_json()["requests"])  # an older driver reads it
