"""Claim problems where users look (issue 31 item 7): a failed prepare becomes ``Ready=False`` conditions on the
claim's ``status.devices`` and a Warning Event on its pods; a prepared device's health flips its condition.

Expected values come from outside: the resource.k8s.io/v1 AllocatedDeviceStatus and metav1.Condition shapes (type,
status "True"/"False", a CamelCase reason), the events.k8s.io/v1 Event fields (regarding, related,
reportingController, reportingInstance, note of at most 1 KiB, series count >= 2), NeuronConfig's
``logicalNeuronCore`` of 1 or 2 (neuron.md), and trn2.48xlarge's 16 devices."""

from __future__ import annotations

import asyncio
import re
import threading
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import msgspec
import pytest
from drarig import DriverRig, host_paths
from hostcache import copy_host, shared_host
from lightkube import ApiError
from lightkube.resources.events_v1 import Event
from lightkube.resources.resource_v1 import ResourceClaim
from lightkube.types import PatchType

from accel_core.dra.claimreport import (
    ClaimProblem,
    PodRef,
    event_body,
    health_changes,
    health_status_patch,
    problem_status_patch,
)
from accel_core.dra.prepared import PreparedClaim, PreparedRequest
from accel_core.dra.reporter import ClaimReporter
from accel_core.dra.status import status_patch
from accel_core.dra.types import ClaimError, ClaimRef, DeviceStatusData
from accel_core.fakehost.host import FakeHost
from accel_core.health import DeviceHealth
from neuron_dra.dra.profile import NeuronProfile

NODE = "node-a"
DRIVER = "neuron.aws.com"
NOW = datetime(2026, 12, 6, 4, 0, 0, 123456, tzinfo=UTC)
CONDITION_REASON = re.compile(r"^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$")  # metav1.Condition's reason pattern
POD = {"resource": "pods", "name": "user", "uid": "pod-uid-1"}


class Rig(DriverRig):
    """A Neuron driver on a trn2.48xlarge tree whose notices keep what they are told."""

    def __init__(self, tmp_path: Path, host: FakeHost, *, blocked: Callable[[], str | None] | None = None) -> None:
        super().__init__(host_paths(tmp_path, host.root), NeuronProfile(), blocked=blocked)
        self.problems = self.notices.problems
        self.prepared = self.notices.claims

    def claim(self, name: str, devices: list[str], params: dict[str, Any] | None = None, *,
              driver: str = DRIVER, reserved: list[dict[str, str]] | None = None) -> ClaimRef:
        return self.add(name, devices, driver=driver, params=[params] if params else [],
                        reserved=[POD] if reserved is None else reserved)

    def fail(self, ref: ClaimRef) -> ClaimError:
        with pytest.raises(ClaimError) as failed:
            self.prepare_one(ref)
        return failed.value


def lnc(value: int) -> dict[str, Any]:
    return {"apiVersion": "neuron.aws.com/v1", "kind": "NeuronConfig", "logicalNeuronCore": value}


def test_a_bad_neuron_config_is_a_problem_with_every_allocated_device_and_the_pod(tmp_path: Path) -> None:
    rig = Rig(tmp_path, shared_host("trn2.48xlarge"))
    devices = [f"neuron-device-{i}" for i in range(4)]
    error = rig.fail(rig.claim("bad", devices, lnc(3)))
    (problem,) = rig.problems
    assert (problem.namespace, problem.name, problem.uid) == ("ns", "bad", "uid-bad")
    assert problem.reason == "InvalidConfig" and problem.cause == str(error) and "logicalNeuronCore" in problem.cause
    assert [d for _, d, _ in problem.devices] == devices and {p for p, _, _ in problem.devices} == {NODE}
    assert problem.pods == (PodRef("user", "pod-uid-1"),)
    assert rig.prepared == []

    body = problem_status_patch(problem, DRIVER, NODE, NOW)
    assert body["metadata"] == {"name": "bad", "namespace": "ns", "uid": "uid-bad"}
    entries = body["status"]["devices"]
    assert [(e["driver"], e["pool"], e["device"]) for e in entries] == [(DRIVER, NODE, d) for d in devices]
    for entry in entries:
        (cond,) = entry["conditions"]
        assert (cond["type"], cond["status"], cond["reason"]) == ("Ready", "False", "InvalidConfig")
        assert CONDITION_REASON.match(cond["reason"]) and cond["lastTransitionTime"] == "2026-12-06T04:00:00Z"
        assert "ns/bad" in cond["message"] and entry["device"] in cond["message"] and NODE in cond["message"]
        assert "logicalNeuronCore" in cond["message"] and "data" not in entry
    msgspec.convert(body, ResourceClaim)  # the API's shape


def test_reasons_name_the_cause(tmp_path: Path) -> None:
    host = copy_host(tmp_path / "host", "trn2.48xlarge")
    host.remove_dev_node("/dev/neuron5")  # the Neuron health rule: /dev node gone
    rig = Rig(tmp_path, host)
    rig.prepare_one(rig.claim("holder", ["neuron-device-0"]))
    rig.fail(rig.claim("clash", ["neuron-device-0"]))
    rig.fail(rig.claim("stranger", ["neuron-device-99"]))
    rig.fail(rig.claim("sick", ["neuron-device-5"]))
    assert [(p.name, p.reason) for p in rig.problems] == [
        ("clash", "DeviceInUse"), ("stranger", "DeviceNotUsable"), ("sick", "DeviceUnhealthy")]
    assert "already prepared for claim ns/holder" in rig.problems[0].cause


def test_a_guarded_node_is_a_problem_of_its_own(tmp_path: Path) -> None:
    guard = "the Neuron device plugin is running on this node"
    rig = Rig(tmp_path, shared_host("trn2.48xlarge"), blocked=lambda: guard)
    rig.fail(rig.claim("guarded", ["neuron-device-0"]))
    assert [(p.reason, p.cause) for p in rig.problems] == [
        ("DevicePluginActive", "the Neuron device plugin is running on this node")]


def test_no_problem_without_an_allocated_device_of_this_driver_here(tmp_path: Path) -> None:
    rig = Rig(tmp_path, shared_host("trn2.48xlarge"))
    rig.fail(rig.claim("other", ["d0"], driver="efa.aws.com"))  # the API server would refuse such an entry
    rig.fail(ClaimRef("ns", "uid-missing", "missing"))  # not in the API server
    unallocated = rig.claim("unallocated", ["neuron-device-0"])
    del rig.claims.claims[("ns", "unallocated")]["status"]["allocation"]
    rig.fail(unallocated)
    assert rig.problems == []


def test_only_pods_in_reserved_for_get_the_event(tmp_path: Path) -> None:
    rig = Rig(tmp_path, shared_host("trn2.48xlarge"))
    rig.fail(rig.claim("bad", ["neuron-device-0"], lnc(3), reserved=[
        POD, {"apiGroup": "example.com", "resource": "workloads", "name": "w", "uid": "w-1"}]))
    assert rig.problems[0].pods == (PodRef("user", "pod-uid-1"),)


def test_event_body_is_a_warning_on_the_pod_related_to_the_claim() -> None:
    problem = ClaimProblem("ns", "bad", "uid-bad", ((NODE, "neuron-device-0", None),), (PodRef("user", "p1"),),
                           "InvalidConfig", "x" * 5000)
    body = event_body(problem, problem.pods[0], name="user.abc", driver=DRIVER, node=NODE, first=NOW)
    assert (body["apiVersion"], body["kind"], body["type"]) == ("events.k8s.io/v1", "Event", "Warning")
    assert body["regarding"] == {"apiVersion": "v1", "kind": "Pod", "namespace": "ns", "name": "user", "uid": "p1"}
    assert body["related"] == {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "namespace": "ns",
                               "name": "bad", "uid": "uid-bad"}
    assert (body["reportingController"], body["reportingInstance"]) == (DRIVER, NODE)
    assert body["eventTime"] == "2026-12-06T04:00:00.123456Z" and len(body["note"].encode()) <= 1024
    assert "series" not in body
    again = event_body(problem, problem.pods[0], name="user.abc", driver=DRIVER, node=NODE, first=NOW, count=3,
                       last=NOW.replace(second=30))
    assert again["series"] == {"count": 3, "lastObservedTime": "2026-12-06T04:00:30.123456Z"}
    assert again["eventTime"] == body["eventTime"], "an Event's eventTime never changes"
    Event.from_dict(again)


def prepared_claim(devices: tuple[str, ...]) -> PreparedClaim:
    return PreparedClaim("uid-c", "ns", "c", NODE, (PreparedRequest("r", devices),),
                         status=tuple((d, DeviceStatusData({"index": i})) for i, d in enumerate(devices)))


def test_ready_follows_health_in_both_bodies() -> None:
    claim = prepared_claim(("neuron-device-0", "neuron-device-1"))
    sick = {"neuron-device-1": DeviceHealth(False, "DevNodeMissing", "/dev/neuron1 is missing")}
    for body in (status_patch(claim, DRIVER, NOW, sick.get, NODE),
                 health_status_patch(claim, DRIVER, NODE, sick.get, NOW)):
        conds = {e["device"]: e["conditions"][0] for e in body["status"]["devices"]}
        assert (conds["neuron-device-0"]["status"], conds["neuron-device-0"]["reason"]) == ("True", "Prepared")
        assert (conds["neuron-device-1"]["status"], conds["neuron-device-1"]["reason"]) == ("False", "DeviceUnhealthy")
        assert "/dev/neuron1 is missing" in conds["neuron-device-1"]["message"]
        msgspec.convert(body, ResourceClaim)
    health_only = health_status_patch(claim, DRIVER, NODE, sick.get, NOW)["status"]["devices"]
    assert all(set(e) == {"driver", "pool", "device", "conditions"} for e in health_only), \
        "the health manager owns only the conditions: the prepare's data stays"


def test_health_changes_compare_with_healthy_by_default() -> None:
    bad = DeviceHealth(False, "PortDown", "down")
    assert health_changes({}, {"a": DeviceHealth(True), "b": bad}) == {"b"}
    assert health_changes({"a": True, "b": False}, {"a": DeviceHealth(True), "b": DeviceHealth(True)}) == {"b"}
    assert health_changes({"a": False}, {}) == {"a"}


# -- the reporter ----------------------------------------------------------------------------------------------------
class FakeClient:
    def __init__(self, failures: list[int] | None = None) -> None:
        self.failures = failures or []
        self.calls: list[dict[str, Any]] = []

    async def patch(self, res: Any, name: str, obj: Any, **kwargs: Any) -> None:
        self.calls.append({"res": res, "name": name, "obj": obj, **kwargs})
        if self.failures:
            code = self.failures.pop(0)
            response = type("R", (), {"json": lambda self: {"code": code, "message": "no"}, "status_code": code})()
            raise ApiError(response=response)  # type: ignore[arg-type]


def problem(cause: str = "logicalNeuronCore: 3 is not 1 or 2") -> ClaimProblem:
    return ClaimProblem("ns", "bad", "uid-bad", ((NODE, "neuron-device-0", None), (NODE, "neuron-device-1", None)),
                        (PodRef("user", "p1"),), "InvalidConfig", cause)


def run_reporter(reporter: ClaimReporter, steps: list[Any]) -> None:
    """Start the reporter, then run each step (a callable, from another thread as the prepare's thread does; or a
    number of calls to wait for)."""
    async def main() -> None:
        stop = asyncio.Event()
        task = asyncio.create_task(reporter.run(stop))
        await asyncio.sleep(0)
        for step in steps:
            if callable(step):
                thread = threading.Thread(target=step)
                thread.start()
                thread.join()
            await asyncio.sleep(0.05)
        stop.set()
        await task

    asyncio.run(main())


def reporter_of(client: FakeClient, prepared: dict[str, PreparedClaim] | None = None,
                health: dict[str, DeviceHealth] | None = None, series: float = 60.0) -> ClaimReporter:
    return ClaimReporter(client, DRIVER, NODE,  # type: ignore[arg-type]
                         prepared=(prepared if prepared is not None else {}).get,
                         health=(health if health is not None else {}).get, series_seconds=series)


def test_retries_of_the_same_failure_write_once() -> None:
    client = FakeClient()
    reporter = reporter_of(client)
    run_reporter(reporter, [lambda: reporter.submit([problem()])] * 5)
    status = [c for c in client.calls if c["res"] is ResourceClaim.Status]
    events = [c for c in client.calls if c["res"] is Event]
    assert len(status) == 1 and len(events) == 1
    assert (status[0]["patch_type"], status[0]["field_manager"], status[0]["force"]) == (PatchType.APPLY, DRIVER,
                                                                                         True)
    assert events[0]["namespace"] == "ns" and events[0]["obj"]["regarding"]["name"] == "user"
    assert events[0]["name"] == events[0]["obj"]["metadata"]["name"] and events[0]["name"].startswith("user.")


def test_a_repeating_failure_updates_the_series_of_the_same_event() -> None:
    client = FakeClient()
    reporter = reporter_of(client, series=0.0)
    run_reporter(reporter, [lambda: reporter.submit([problem()])] * 3)
    events = [c for c in client.calls if c["res"] is Event]
    assert len({e["name"] for e in events}) == 1 and len(events) == 3
    assert "series" not in events[0]["obj"] and [e["obj"]["series"]["count"] for e in events[1:]] == [2, 3]
    assert len({e["obj"]["eventTime"] for e in events}) == 1


def test_a_new_cause_is_written_and_a_prepared_claim_is_not() -> None:
    client = FakeClient()
    prepared: dict[str, PreparedClaim] = {}
    reporter = reporter_of(client, prepared)
    run_reporter(reporter, [lambda: reporter.submit([problem()]), lambda: reporter.submit([problem("other")]),
                            lambda: prepared.update({"uid-bad": prepared_claim(("neuron-device-0",))}),
                            lambda: reporter.submit([problem("third")])])
    status = [c["obj"]["status"]["devices"][0]["conditions"][0]["message"] for c in client.calls
              if c["res"] is ResourceClaim.Status]
    assert len(status) == 2 and status[1].endswith(": other")


def test_resolved_claims_are_reported_again() -> None:
    client = FakeClient()
    reporter = reporter_of(client)
    run_reporter(reporter, [lambda: reporter.submit([problem()]), lambda: reporter.resolved(["uid-bad"]),
                            lambda: reporter.submit([problem()])])
    assert len([c for c in client.calls if c["res"] is Event]) == 2


def test_a_failed_event_write_is_tried_again_on_the_next_retry() -> None:
    client = FakeClient([500, 403])  # the status write fails, then the Event
    reporter = reporter_of(client)
    run_reporter(reporter, [lambda: reporter.submit([problem()]), lambda: reporter.submit([problem()])])
    assert [c["res"] for c in client.calls] == [ResourceClaim.Status, Event, ResourceClaim.Status, Event]
    assert reporter.failed == 2 and reporter.status_writes == 1 and reporter.events_created == 1


def test_health_flips_rewrite_the_conditions_of_the_claims_holding_the_device() -> None:
    client = FakeClient()
    holder = prepared_claim(("neuron-device-0", "neuron-device-1"))
    other = PreparedClaim("uid-o", "ns", "o", NODE, (PreparedRequest("r", ("neuron-device-2",)),))
    health = {d: DeviceHealth(True) for d in ("neuron-device-0", "neuron-device-1", "neuron-device-2")}
    reporter = reporter_of(client, {"uid-c": holder, "uid-o": other}, health)
    claims = [holder, other]

    def sick() -> None:
        health["neuron-device-1"] = DeviceHealth(False, "DevNodeMissing", "/dev/neuron1 is missing")

    def well() -> None:
        health["neuron-device-1"] = DeviceHealth(True)

    async def main() -> list[int]:
        stop = asyncio.Event()
        task = asyncio.create_task(reporter.run(stop))
        queued = [reporter.health_changed(dict(health), claims)]  # all healthy, as the prepare wrote: nothing
        sick()
        queued.append(reporter.health_changed(dict(health), claims))
        queued.append(reporter.health_changed(dict(health), claims))  # no flip: nothing
        await asyncio.sleep(0.05)
        well()
        queued.append(reporter.health_changed(dict(health), claims))
        await asyncio.sleep(0.05)
        stop.set()
        await task
        return queued

    assert asyncio.run(main()) == [0, 1, 0, 1]
    assert [c["name"] for c in client.calls] == ["c", "c"], "only the claim holding the device"
    assert {c["field_manager"] for c in client.calls} == {f"{DRIVER}-health"}
    ready = [{e["device"]: e["conditions"][0]["status"] for e in c["obj"]["status"]["devices"]} for c in client.calls]
    assert ready == [{"neuron-device-0": "True", "neuron-device-1": "False"},
                     {"neuron-device-0": "True", "neuron-device-1": "True"}]
