"""The generic ResourceSlice publisher against an in-memory API server double: writes only on change, generation
bumps, splitting, retries while the server is away, completing half-written pools, dropped taint fields, and
removal of only our own slices. (The real API server is exercised in tests/e2e.)"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import httpx2
import pytest
from accel_rig.polling import until
from lightkube import ApiError
from lightkube.models.meta_v1 import Status
from lightkube.models.resource_v1 import ResourceSliceSpec
from lightkube.resources.core_v1 import Node
from lightkube.resources.resource_v1 import ResourceSlice

from accel_core.dra.publisher import SlicePublisher, build_slices, spec_key, without_taints
from accel_core.dra.slicemodel import SliceDevice, Taint, quantity

DRIVER = "toy.example.com"
NODE = "node-a"


Objects = list[dict[str, Any]]  # (FakeApi.list shadows the builtin inside the class)
Calls = list[tuple[str, str]]
Watchers = list[asyncio.Queue[tuple[str, dict[str, Any]]]]


class FakeListing:
    def __init__(self, items: list[Any], rv: str) -> None:
        self._items = items
        self.resourceVersion = rv

    async def __aiter__(self) -> AsyncIterator[Any]:
        for item in self._items:
            yield item


class FakeApi:
    """Just enough of lightkube's AsyncClient for the publisher: node get, slice list/watch/create/replace/delete."""

    def __init__(self, *, drop_taints: bool = False) -> None:
        self.slices: dict[str, dict[str, Any]] = {}
        self.rv = itertools.count(100)
        self.names = itertools.count(1)
        self.drop_taints = drop_taints
        self.down = False
        self.fail_creates_after: int | None = None  # allow N creates, then fail the rest once
        self.calls: Calls = []
        self.watchers: Watchers = []

    @property
    def writes(self) -> Calls:
        return [c for c in self.calls if c[0] in ("create", "replace", "delete")]

    def _check_up(self) -> None:
        if self.down:
            raise httpx2.ConnectError("connection refused")

    def _emit(self, kind: str, obj: dict[str, Any]) -> None:
        for q in self.watchers:
            q.put_nowait((kind, obj))

    def _store(self, obj: dict[str, Any]) -> dict[str, Any]:
        obj["metadata"]["resourceVersion"] = str(next(self.rv))
        if self.drop_taints:
            for d in obj["spec"].get("devices") or []:
                d.pop("taints", None)
        self.slices[obj["metadata"]["name"]] = obj
        return obj

    async def get(self, res: Any, name: str) -> Any:
        self._check_up()
        self.calls.append(("get", name))
        assert res is Node
        return Node.from_dict({"metadata": {"name": name, "uid": "node-uid-1"}})

    def list(self, res: Any, *, fields: dict[str, str]) -> FakeListing:
        self._check_up()
        self.calls.append(("list", ""))
        items = [ResourceSlice.from_dict(o) for o in self.slices.values()
                 if o["spec"]["nodeName"] == fields["spec.nodeName"] and o["spec"]["driver"] == fields["spec.driver"]]
        return FakeListing(items, str(next(self.rv)))

    async def watch(self, res: Any, *, fields: dict[str, str], resource_version: str | None) -> AsyncIterator[Any]:
        self._check_up()
        q: asyncio.Queue[tuple[str, dict[str, Any]]] = asyncio.Queue()
        self.watchers.append(q)
        try:
            while True:
                kind, obj = await q.get()
                if kind == "BREAK":
                    raise httpx2.ReadError("watch stream broken")
                spec = obj["spec"]
                if spec["nodeName"] == fields["spec.nodeName"] and spec["driver"] == fields["spec.driver"]:
                    yield kind, ResourceSlice.from_dict(obj)
        finally:
            self.watchers.remove(q)

    async def create(self, obj: Any) -> Any:
        self._check_up()
        if self.fail_creates_after is not None:
            if self.fail_creates_after == 0:
                self.fail_creates_after = None
                raise httpx2.ConnectError("connection reset during create")
            self.fail_creates_after -= 1
        data = obj.to_dict()
        data["metadata"]["name"] = data["metadata"].pop("generateName") + f"x{next(self.names)}"
        self.calls.append(("create", data["metadata"]["name"]))
        stored = self._store(data)
        self._emit("ADDED", stored)
        return ResourceSlice.from_dict(stored)

    async def replace(self, obj: Any) -> Any:
        self._check_up()
        data = obj.to_dict()
        name = data["metadata"]["name"]
        current = self.slices.get(name)
        if current is None or current["metadata"]["resourceVersion"] != data["metadata"].get("resourceVersion"):
            raise ApiError(status=Status(code=409, message=f"conflict on {name}"))
        self.calls.append(("replace", name))
        stored = self._store(data)
        self._emit("MODIFIED", stored)
        return ResourceSlice.from_dict(stored)

    async def delete(self, res: Any, name: str) -> None:
        self._check_up()
        self.calls.append(("delete", name))
        obj = self.slices.pop(name, None)
        if obj is None:
            raise ApiError(status=Status(code=404, message="not found"))
        self._emit("DELETED", obj)

    def foreign(self, name: str, driver: str, node: str) -> None:
        self.slices[name] = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
                             "metadata": {"name": name, "resourceVersion": "1"},
                             "spec": {"driver": driver, "nodeName": node,
                                      "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
                                      "devices": [{"name": "other"}]}}

    def ours(self) -> Objects:
        return [o for o in self.slices.values() if o["spec"]["driver"] == DRIVER and o["spec"]["nodeName"] == NODE]


def devices(n: int, *, tainted: tuple[int, ...] = (), mem: int = 96 * 2**30) -> list[SliceDevice]:
    return [SliceDevice(f"dev-{i}", {"index": i, "model": "toy"}, {"memory": mem},
                        (Taint("toy.example.com/unhealthy", "Broken", "NoSchedule"),) if i in tainted else ())
            for i in range(n)]


async def watching(api: FakeApi) -> None:
    """Wait until the publisher's first sync is done (it lists and reconciles before it starts watching)."""
    await until(lambda: bool(api.watchers), "the watch")


async def reconciled(pub: SlicePublisher, api: FakeApi) -> None:
    """Replay our slices as watch events and wait for the reconcile pass they cause: anything the publisher would
    write for the current state has been written when this returns."""
    before = pub.reconciles
    assert api.ours(), "replaying needs a published slice"
    for obj in api.ours():
        api._emit("MODIFIED", obj)
    await until(lambda: pub.reconciles > before, "a reconcile pass")


def run_with(api: FakeApi, scenario: Callable[[SlicePublisher, FakeApi], Awaitable[None]], **kw: Any) -> None:
    async def main() -> None:
        fast = {"backoff_initial": 0.01, "backoff_max": 0.05, "unreachable_retry": 0.01}
        pub = SlicePublisher(api, DRIVER, NODE, **{**fast, **kw})  # type: ignore[arg-type]
        stop = asyncio.Event()
        task = asyncio.create_task(pub.run(stop))
        try:
            await scenario(pub, api)
        finally:
            stop.set()
            await asyncio.wait_for(task, 5)
    asyncio.run(main())


# -- pure parts -----------------------------------------------------------------------------------------------------
def test_build_splits_large_pools_and_smaller_with_taints() -> None:
    plain = build_slices(DRIVER, NODE, devices(200), node_uid="u1")
    assert [len(s.spec.devices or ()) for s in plain] == [128, 72]
    assert {s.spec.pool.resourceSliceCount for s in plain} == {2}
    assert plain[0].to_dict()["metadata"]["ownerReferences"] == [
        {"apiVersion": "v1", "kind": "Node", "name": NODE, "uid": "u1", "controller": True}]
    assert plain[0].to_dict()["metadata"]["generateName"] == f"{NODE}-{DRIVER}-"
    tainted = build_slices(DRIVER, NODE, devices(200, tainted=(7,)))
    assert [len(s.spec.devices or ()) for s in tainted] == [64, 64, 64, 8]
    assert "ownerReferences" not in tainted[0].to_dict()["metadata"]
    assert build_slices(DRIVER, NODE, []) == []


def test_built_slices_are_the_api_json() -> None:
    [obj] = build_slices(DRIVER, NODE, devices(1, tainted=(0,)), node_uid="u1")
    assert obj.to_dict() == {  # written out from the resource.k8s.io/v1 ResourceSlice reference
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
        "metadata": {"generateName": f"{NODE}-{DRIVER}-", "ownerReferences": [
            {"apiVersion": "v1", "kind": "Node", "name": NODE, "uid": "u1", "controller": True}]},
        "spec": {"driver": DRIVER, "nodeName": NODE,
                 "pool": {"name": NODE, "generation": 1, "resourceSliceCount": 1},
                 "devices": [{"name": "dev-0",
                              "attributes": {"index": {"int": 0}, "model": {"string": "toy"}},
                              "capacity": {"memory": {"value": "96Gi"}},
                              "taints": [{"key": "toy.example.com/unhealthy", "value": "Broken",
                                          "effect": "NoSchedule"}]}]}}


def test_quantities_and_spec_key_ignore_spelling_and_taint_time() -> None:
    assert quantity(96 * 2**30) == "96Gi" and quantity(8) == "8" and quantity(1000) == "1000"
    spec = build_slices(DRIVER, NODE, devices(1, tainted=(0,)))[0].spec
    sent = spec.to_dict()
    # what an API server sends back: another generation, the capacity spelled out, a taint time added
    server = ResourceSliceSpec.from_dict({**sent, "pool": {**sent["pool"], "generation": 9}, "devices": [
        {**sent["devices"][0], "capacity": {"memory": {"value": str(96 * 2**30)}},
         "taints": [{**sent["devices"][0]["taints"][0], "timeAdded": "2026-01-01T00:00:00Z"}]}]})
    assert spec_key(server) == spec_key(spec)
    assert spec_key(ResourceSliceSpec.from_dict({**sent, "nodeName": "other"})) != spec_key(spec)
    assert spec_key(ResourceSliceSpec.from_dict({**sent, "devices": [
        {**sent["devices"][0], "capacity": {"memory": {"value": "95Gi"}}}]})) != spec_key(spec)


def test_without_taints_leaves_tainted_devices_out() -> None:
    kept = without_taints(devices(3, tainted=(1,)) + [SliceDevice("soft", taints=(Taint("a/b", "", "None"),))])
    assert [d.name for d in kept] == ["dev-0", "dev-2", "soft"] and not kept[-1].taints


# -- publishing -----------------------------------------------------------------------------------------------------
def test_publishes_once_then_writes_only_on_change() -> None:
    async def scenario(pub: SlicePublisher, api: FakeApi) -> None:
        await watching(api)
        assert api.writes == [], "nothing is written before the driver hands over its device list"
        pub.set_devices(devices(4))
        await asyncio.wait_for(pub.published.wait(), 5)
        [obj] = api.ours()
        assert obj["spec"]["pool"] == {"name": NODE, "generation": 1, "resourceSliceCount": 1}
        assert obj["metadata"]["ownerReferences"][0]["uid"] == "node-uid-1"
        assert len(api.writes) == 1
        # the same list again, and watch events for our own write: no writes
        pub.set_devices(devices(4))
        await reconciled(pub, api)
        assert len(api.writes) == 1 and pub.writes == 1
        # a change: same slice replaced with the generation bumped
        pub.set_devices(devices(5))
        await until(lambda: len(api.writes) == 2, "the update")
        [obj2] = api.ours()
        assert obj2["metadata"]["name"] == obj["metadata"]["name"]
        assert obj2["spec"]["pool"]["generation"] == 2 and len(obj2["spec"]["devices"]) == 5
        assert api.writes[-1][0] == "replace"
    run_with(FakeApi(), scenario)


def test_restart_adopts_matching_slices_without_writing() -> None:
    api = FakeApi()

    async def first(pub: SlicePublisher, api: FakeApi) -> None:
        pub.set_devices(devices(3))
        await asyncio.wait_for(pub.published.wait(), 5)

    async def second(pub: SlicePublisher, api: FakeApi) -> None:
        pub.set_devices(devices(3))
        await asyncio.wait_for(pub.published.wait(), 5)
        await reconciled(pub, api)
        assert pub.writes == 0 and pub.generation == 1

    run_with(api, first)
    before = len(api.writes)
    run_with(api, second)
    assert len(api.writes) == before


def test_recreates_slices_deleted_behind_its_back() -> None:
    async def scenario(pub: SlicePublisher, api: FakeApi) -> None:
        pub.set_devices(devices(2))
        await asyncio.wait_for(pub.published.wait(), 5)
        [name] = [o["metadata"]["name"] for o in api.ours()]
        await api.delete(ResourceSlice, name)  # as the kubelet's wipe would
        await until(lambda: len(api.ours()) == 1 and api.ours()[0]["metadata"]["name"] != name, "re-creation")
        assert api.ours()[0]["spec"]["pool"]["generation"] == 2
    run_with(FakeApi(), scenario)


def test_retries_with_backoff_while_the_api_server_is_away() -> None:
    api = FakeApi()
    api.down = True

    async def scenario(pub: SlicePublisher, api: FakeApi) -> None:
        pub.set_devices(devices(2))
        await until(lambda: pub.metrics.errors.labels(DRIVER)._value.get() >= 2, "two failed attempts")
        assert not pub.published.is_set() and api.ours() == []
        api.down = False
        await asyncio.wait_for(pub.published.wait(), 5)
        assert len(api.ours()) == 1
        # the watch breaks and the server goes away again: relist, nothing to write
        api.down = True
        failed = pub.metrics.errors.labels(DRIVER)._value.get()
        api._emit("BREAK", {})
        await until(lambda: pub.metrics.errors.labels(DRIVER)._value.get() >= failed + 2, "retries while away")
        before = pub.reconciles
        api.down = False
        await until(lambda: pub.reconciles > before, "the reconcile after the relist")
        assert ("list", "") in api.calls[-3:] and pub.writes == 1
    run_with(api, scenario)


def test_a_half_written_update_is_completed() -> None:
    api = FakeApi()
    api.fail_creates_after = 1  # the second slice of a 2-slice pool fails once

    async def scenario(pub: SlicePublisher, api: FakeApi) -> None:
        pub.set_devices(devices(200))
        await until(lambda: len(api.ours()) == 2 and pub.published.is_set(), "a complete pool")
        gens = {o["spec"]["pool"]["generation"] for o in api.ours()}
        counts = {o["spec"]["pool"]["resourceSliceCount"] for o in api.ours()}
        assert len(gens) == 1 and counts == {2}, "every slice of the newest generation, none missing"
        assert sorted(d["name"] for o in api.ours() for d in o["spec"]["devices"]) == sorted(
            f"dev-{i}" for i in range(200))
        # shrinking to one slice deletes the surplus one
        pub.set_devices(devices(3))
        await until(lambda: len(api.ours()) == 1, "the shrink")
        assert api.ours()[0]["spec"]["pool"]["resourceSliceCount"] == 1
    run_with(api, scenario)


def test_dropped_taints_fall_back_to_leaving_devices_out() -> None:
    async def scenario(pub: SlicePublisher, api: FakeApi) -> None:
        pub.set_devices(devices(4, tainted=(2,)))
        await until(lambda: pub.taints_supported is False and pub.published.is_set()
                    and len(api.ours()[0]["spec"]["devices"]) == 3, "the fallback")
        assert [d["name"] for d in api.ours()[0]["spec"]["devices"]] == ["dev-0", "dev-1", "dev-3"]
        writes = len(api.writes)
        await reconciled(pub, api)
        assert len(api.writes) == writes, "no write loop"
        pub.set_devices(devices(4))  # healed
        await until(lambda: len(api.ours()[0]["spec"]["devices"]) == 4, "the healed device")
    run_with(FakeApi(drop_taints=True), scenario)


def test_taints_kept_when_the_server_supports_them() -> None:
    async def scenario(pub: SlicePublisher, api: FakeApi) -> None:
        pub.set_devices(devices(2, tainted=(1,)))
        await asyncio.wait_for(pub.published.wait(), 5)
        await reconciled(pub, api)
        assert pub.taints_supported is True and pub.writes == 1
        assert api.ours()[0]["spec"]["devices"][1]["taints"][0]["value"] == "Broken"
    run_with(FakeApi(), scenario)


def test_empty_list_publishes_nothing_and_remove_all_only_touches_ours() -> None:
    api = FakeApi()
    api.foreign("other-driver", "gpu.example.com", NODE)
    api.foreign("other-node", DRIVER, "node-b")

    async def scenario(pub: SlicePublisher, api: FakeApi) -> None:
        pub.set_devices([])
        await asyncio.wait_for(pub.published.wait(), 5)
        assert api.writes == []
        pub.set_devices(devices(1))
        await until(lambda: len(api.ours()) == 1, "the slice")
        pub.set_devices([])
        await until(lambda: api.ours() == [], "the deletion")
        pub.set_devices(devices(1))
        await until(lambda: len(api.ours()) == 1, "the slice again")
        assert await pub.remove_all() == 1
        assert set(api.slices) == {"other-driver", "other-node"}
    run_with(api, scenario)


def test_set_devices_validates_before_anything_is_sent() -> None:
    async def scenario(pub: SlicePublisher, api: FakeApi) -> None:
        with pytest.raises(ValueError, match="device dev-0.*65 characters"):
            pub.set_devices([SliceDevice("dev-0", {"s": "x" * 65})])
        await watching(api)
        assert api.writes == []
    run_with(FakeApi(), scenario)


def test_conflicting_update_relists_and_retries() -> None:
    async def scenario(pub: SlicePublisher, api: FakeApi) -> None:
        pub.set_devices(devices(1))
        await asyncio.wait_for(pub.published.wait(), 5)
        [name] = list(api.slices)
        api.slices[name]["metadata"]["resourceVersion"] = "999999"  # someone else wrote; our cache is stale
        with contextlib.suppress(Exception):
            api.watchers.clear()  # and we missed the event
        pub.set_devices(devices(2))
        await until(lambda: len(api.ours()[0]["spec"]["devices"]) == 2, "the retried update")
    run_with(FakeApi(), scenario)


class ErrorApi(FakeApi):
    """Answers the slice ``list`` (made by every sync) with ``error`` while it is set, and records each attempt."""

    def __init__(self) -> None:
        super().__init__()
        self.error: Exception | None = None
        self.attempts: list[float] = []

    def list(self, res: Any, *, fields: dict[str, str]) -> FakeListing:
        self.attempts.append(asyncio.get_running_loop().time())
        if self.error is not None:
            raise self.error
        return super().list(res, fields=fields)


def gaps(times: list[float]) -> list[float]:
    return [b - a for a, b in itertools.pairwise(times)]


def run_error_api(api: ErrorApi, scenario: Callable[[SlicePublisher, FakeApi], Awaitable[None]]) -> None:
    run_with(api, scenario, backoff_initial=0.05, backoff_max=0.4, unreachable_retry=0.05)


def server_error() -> ApiError:
    return ApiError(status=Status(code=500, message="etcdserver: request timed out"))


def test_backoff_grows_on_server_errors_and_a_success_resets_it() -> None:
    api = ErrorApi()
    api.error = server_error()

    async def scenario(pub: SlicePublisher, fake: FakeApi) -> None:
        await until(lambda: len(api.attempts) >= 6, "six attempts", timeout=10)
        grown = gaps(api.attempts[:6])  # 0.05, 0.1, 0.2, 0.4, 0.4 (each +-20%)
        assert grown[0] < 0.08 and grown[2] > 0.15 and grown[3] > 0.3
        api.error = None
        pub.set_devices(devices(1))
        await asyncio.wait_for(pub.published.wait(), 5)
        # the watch breaks: a new sync meets a server error again, and waits the initial backoff, not 0.4 s
        api.error = server_error()
        before = len(api.attempts)
        fake._emit("BREAK", {})
        await until(lambda: len(api.attempts) >= before + 2, "two attempts after the break", timeout=10)
        assert gaps(api.attempts[before:before + 2])[0] < 0.08
    run_error_api(api, scenario)


def test_an_unreachable_server_is_retried_at_a_flat_short_interval() -> None:
    api = ErrorApi()
    api.error = httpx2.ConnectError("connection refused")

    async def scenario(pub: SlicePublisher, fake: FakeApi) -> None:
        await until(lambda: len(api.attempts) >= 15, "15 attempts", timeout=30)
        # flat: exponential (0.05 doubling to 0.4, -20% jitter) would have a gap of at least 0.32 s by now
        assert max(gaps(api.attempts)) < 0.3
        api.error = ApiError(status=Status(code=503, message="the server is currently unable to handle the request"))
        before = len(api.attempts)
        await until(lambda: len(api.attempts) >= before + 6, "six more attempts", timeout=30)
        assert max(gaps(api.attempts[before:])) < 0.3  # an API server still starting counts as not there yet
        api.error = None
        pub.set_devices(devices(1))
        await asyncio.wait_for(pub.published.wait(), 1)
    run_error_api(api, scenario)
