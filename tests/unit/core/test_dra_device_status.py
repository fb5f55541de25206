"""Device status (ResourceClaim ``status.devices``, GA in Kubernetes 1.37): what each driver says about the devices
it prepared, the server-side apply body, and the writer that sends it after the prepare answered.

Expected values come from outside: the trn2.48xlarge neuron-ls listing (device index -> PCI BDF), trn2's 8 physical
NeuronCores per device (4 logical cores at LNC 2, the default, 8 at LNC 1), the fake host's sysfs for the EFAs, and
the resource.k8s.io/v1 AllocatedDeviceStatus fields."""

from __future__ import annotations

import asyncio
import os
import threading
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import msgspec
import pytest
from drarig import DriverRig, host_paths
from hostcache import shared_host
from lightkube import ApiError
from lightkube.resources.resource_v1 import ResourceClaim
from lightkube.types import PatchType
from neuron_listings import TRN2_48XLARGE_GUIDE

from accel_core.dra.prepared import PreparedClaim
from accel_core.dra.profile import DraProfile
from accel_core.dra.status import DeviceStatusWriter, status_patch
from accel_core.dra.types import ClaimError, DeviceStatusData
from efa_plugin.dra.profile import EfaProfile
from neuron_dra.dra.profile import NeuronProfile

NODE = "node-a"
LNC1 = {"apiVersion": "neuron.aws.com/v1", "kind": "NeuronConfig", "logicalNeuronCore": 1}
NOW = datetime(2026, 12, 3, 17, 0, 0, tzinfo=UTC)


def make_rig(tmp_path: Path, profile: DraProfile[Any, Any], instance_type: str) -> DriverRig:
    """A driver whose notices keep the claims it prepared."""
    return DriverRig(host_paths(tmp_path, shared_host(instance_type).root), profile)


def status_of(rig: DriverRig) -> dict[str, dict[str, Any]]:
    """The status body of the one claim prepared, by device."""
    (claim,) = rig.notices.claims
    return {e["device"]: e for e in status_patch(claim, rig.driver_name, NOW)["status"]["devices"]}


@pytest.mark.parametrize(("configs", "cores", "lnc"), [(None, ["0-3", "4-7"], 2), ([LNC1], ["0-7", "8-15"], 1)],
                         ids=["lnc-default-2", "lnc-1"])
def test_neuron_status_names_index_bdf_cores_and_lnc(tmp_path: Path, configs: list[dict[str, Any]] | None,
                                                     cores: list[str], lnc: int) -> None:
    rig = make_rig(tmp_path, NeuronProfile(), "trn2.48xlarge")
    rig.prepare_one(rig.add("two", ["neuron-device-9", "neuron-device-8"], params=configs or []))
    status = status_of(rig)
    assert sorted(status) == ["neuron-device-8", "neuron-device-9"]
    for index, visible in zip((8, 9), cores, strict=True):  # the container sees 8 first, then 9
        data = status[f"neuron-device-{index}"]["data"]
        assert data == {"index": index, "pciBusID": TRN2_48XLARGE_GUIDE[index][1], "visibleCores": visible,
                        "logicalNeuronCore": lnc}
        assert "networkData" not in status[f"neuron-device-{index}"]


def test_efa_status_names_the_rdma_device_and_uverbs_node(tmp_path: Path) -> None:
    rig = make_rig(tmp_path, EfaProfile(), "p5.48xlarge")
    names = [d.name for d in rig.profile.scan(rig.paths, "1.0.0").devices][:2]
    rig.prepare_one(rig.add("two", names))
    status = status_of(rig)
    sysfs = rig.paths.host_root / "sys" / "class" / "infiniband_verbs"
    for name in names:
        data = status[name]["data"]
        uverbs = data["uverbs"].removeprefix("/dev/infiniband/")
        # the host's own files: uverbsN/ibdev names the RDMA device, uverbsN/device is its PCI function
        assert (sysfs / uverbs / "ibdev").read_text().strip() == data["rdmaDevice"]
        assert os.path.basename(os.path.realpath(sysfs / uverbs / "device")) == data["pciBusID"]
        assert name == "efa-" + data["pciBusID"].replace(":", "-").replace(".", "-")
        assert "networkData" not in status[name], "an EFA has no network interface of its own"


def test_the_apply_body_is_this_drivers_entries_with_a_ready_condition(tmp_path: Path) -> None:
    rig = make_rig(tmp_path, NeuronProfile(), "trn2.48xlarge")
    rig.prepare_one(rig.add("one", ["neuron-device-3"]))
    body = status_patch(rig.notices.claims[0], "neuron.aws.com", NOW)
    assert (body["apiVersion"], body["kind"]) == ("resource.k8s.io/v1", "ResourceClaim")
    assert body["metadata"] == {"name": "one", "namespace": "ns", "uid": "uid-one"}  # the UID: a precondition
    (entry,) = body["status"]["devices"]
    assert (entry["driver"], entry["pool"], entry["device"]) == ("neuron.aws.com", NODE, "neuron-device-3")
    (cond,) = entry["conditions"]
    assert (cond["type"], cond["status"], cond["lastTransitionTime"]) == ("Ready", "True", "2026-12-03T17:00:00Z")
    assert cond["reason"]
    msgspec.convert(body, ResourceClaim)  # the shape lightkube (and the API) knows


def test_only_newly_prepared_claims_reach_the_sink(tmp_path: Path) -> None:
    rig = make_rig(tmp_path, NeuronProfile(), "trn2.48xlarge")
    first = rig.add("first", ["neuron-device-0"])
    rig.prepare_one(first)
    rig.prepare_one(first)  # answered again from the checkpoint: its status was written the first time
    with pytest.raises(ClaimError):
        rig.prepare_one(rig.add("clash", ["neuron-device-0"]))
    assert [c.name for c in rig.notices.claims] == ["first"]


# -- the writer ------------------------------------------------------------------------------------------------------
class FakeClient:
    def __init__(self, failures: list[int]) -> None:
        self.failures = failures
        self.calls: list[dict[str, Any]] = []
        self.done = asyncio.Event()

    async def patch(self, res: Any, name: str, obj: Any, **kwargs: Any) -> None:
        self.calls.append({"res": res, "name": name, "obj": obj, **kwargs})
        if self.failures:
            code = self.failures.pop(0)
            response = type("R", (), {"json": lambda self: {"code": code, "message": "no"}, "status_code": code})()
            raise ApiError(response=response)  # type: ignore[arg-type]
        self.done.set()


def claim_of(name: str) -> PreparedClaim:
    return PreparedClaim(f"uid-{name}", "ns", name, NODE, (),
                         status=(("neuron-device-0", DeviceStatusData({"index": 0})),))


def run_writer(client: FakeClient, claims: list[PreparedClaim], wait_for: int,
               monkeypatch: pytest.MonkeyPatch, prepared: set[str] | None = None) -> DeviceStatusWriter:
    monkeypatch.setattr("accel_core.dra.status.RETRY_SECONDS", 0.0)
    writer = DeviceStatusWriter(client, "neuron.aws.com", delay=0.0,  # type: ignore[arg-type]
                                still_prepared=lambda uid: prepared is None or uid in prepared)

    async def main() -> None:
        stop = asyncio.Event()
        task = asyncio.create_task(writer.run(stop))
        await asyncio.sleep(0)
        # submitted from another thread, as the prepare's thread does
        threading.Thread(target=writer.submit, args=(claims,)).start()
        for _ in range(200):
            if len(client.calls) >= wait_for:
                break
            await asyncio.sleep(0.01)
        stop.set()
        await task

    asyncio.run(main())
    return writer


def test_writer_applies_the_status_subresource_as_the_driver(monkeypatch: pytest.MonkeyPatch) -> None:
    client = FakeClient([500])  # one failure, then the retry goes through
    run_writer(client, [claim_of("a")], 2, monkeypatch)
    assert len(client.calls) == 2
    call = client.calls[-1]
    assert call["res"] is ResourceClaim.Status and call["name"] == "a" and call["namespace"] == "ns"
    assert (call["patch_type"], call["field_manager"], call["force"]) == (PatchType.APPLY, "neuron.aws.com", True)


def test_writer_drops_a_claim_that_is_gone(monkeypatch: pytest.MonkeyPatch) -> None:
    client = FakeClient([404])
    run_writer(client, [claim_of("gone"), claim_of("next")], 2, monkeypatch)
    assert [c["name"] for c in client.calls] == ["gone", "next"], "a 404 is not retried"


def test_writer_skips_a_claim_unprepared_before_its_turn(monkeypatch: pytest.MonkeyPatch) -> None:
    client = FakeClient([])
    writer = run_writer(client, [claim_of("gone"), claim_of("kept")], 1, monkeypatch, prepared={"uid-kept"})
    assert [c["name"] for c in client.calls] == ["kept"] and writer.skipped == 1
