"""The Neuron DRA driver service over real unix sockets, driven by the kubelet stand-in: registration, prepare and
unprepare through the DRA socket, the health stream following the host, the liveness probe, the coexistence guard,
and a restart that restores prepared claims."""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
from pathlib import Path
from typing import Any

import grpc
from accel_rig.kubelet_standin import socket_files
from cdi_oracle import assert_cdi_accepts
from drarig import DictClaims, claim, running_service, served_paths
from hostcache import copy_host

from accel_core.dra.daemon import DraService
from accel_core.dra.liveness import NOT_SERVING, SERVING, HealthCheckRequest, HealthCheckResponse
from accel_core.fakehost import FakeHost
from accel_core.kubeletapi import dra_health_v1alpha1_pb2 as hp
from accel_core.kubeletapi import podresources_v1_pb2 as pr
from accel_core.paths import HostPaths
from neuron_dra.dra.profile import NeuronProfile

DRIVER = "neuron.aws.com"
NODE = "node-a"


def allocate(claims: DictClaims, uid: str, name: str, indices: list[int],
             config: dict[str, Any] | None = None) -> None:
    claims.add(claim(name, [f"neuron-device-{i}" for i in indices], driver=DRIVER, uid=uid, request="neurons",
                     params=[config] if config else []))


class Rig:
    def __init__(self, root: Path, instance_type: str = "trn2.48xlarge") -> None:
        self.host: FakeHost = copy_host(root / "h", instance_type)
        self.standin, self.paths = served_paths(root, self.host.root)
        self.reader = DictClaims()

    def running(self, pod_uid: str = "pod-1", refresh: float = 20.0, registration_wait: float = 0.0,
                publisher: Any = None) -> contextlib.AbstractAsyncContextManager[DraService]:
        return running_service(NeuronProfile(), self.paths, claims=self.reader, publisher=publisher, pod_uid=pod_uid,
                               healthcheck_port=0, rescan_interval=0.2, health_refresh_seconds=refresh,
                               registration_wait=registration_wait)


async def _spec(paths: HostPaths, uid: str, devices: Any = ()) -> dict[str, Any]:
    """The claim's spec, after containerd's CDI library loaded the whole CDI root and resolved ``devices`` (the
    kubelet's cdi_device_ids answer) from it."""
    ids = [i for d in devices for i in d.cdi_device_ids]
    await asyncio.to_thread(assert_cdi_accepts, paths.cdi_root, ids)
    data: dict[str, Any] = json.loads((paths.cdi_root / f"k8s.neuron.aws.com-claim_{uid}.json").read_text())
    return data


async def _check(port: int, service_name: str) -> int:
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        call = channel.unary_unary("/grpc.health.v1.Health/Check",
                                   request_serializer=HealthCheckRequest.SerializeToString,
                                   response_deserializer=HealthCheckResponse.FromString)
        resp = await call(HealthCheckRequest(service=service_name), timeout=5)
        return int(resp.status)


def test_prepare_and_unprepare_through_the_dra_socket(short_tmp: Path) -> None:
    rig = Rig(short_tmp)

    async def scenario() -> None:
        async with rig.running() as service:
            conn = await rig.standin.register_dra(DRIVER)
            assert conn.version == "v1.DRAPlugin"
            allocate(rig.reader, "u-row", "row", [4, 5, 6, 7])
            allocate(rig.reader, "u-lnc", "lnc", list(range(8, 16)),
                                {"apiVersion": "neuron.aws.com/v1", "kind": "NeuronConfig", "logicalNeuronCore": 1})
            allocate(rig.reader, "u-bad", "bad", [0], {"apiVersion": "neuron.aws.com/v1", "kind": "NeuronConfig",
                                                       "logicalNeuronCore": 3})
            resp: Any = await conn.prepare(("ns", "u-row", "row"), ("ns", "u-lnc", "lnc"), ("ns", "u-bad", "bad"))
            assert resp["u-row"].error == ""
            assert [d.device_name for d in resp["u-row"].devices] == [f"neuron-device-{i}" for i in (4, 5, 6, 7)]
            assert list(resp["u-row"].devices[0].cdi_device_ids) == [
                "k8s.neuron.aws.com/claim=u-row-neuron-device-4", "k8s.neuron.aws.com/claim=u-row-request-neurons"]
            assert "logicalNeuronCore must be 1 or 2, got 3" in resp["u-bad"].error
            assert "ns/bad" in resp["u-bad"].error
            await _spec(rig.paths, "u-row", resp["u-row"].devices)
            lnc = await _spec(rig.paths, "u-lnc", resp["u-lnc"].devices)
            env = [e for d in lnc["devices"] for e in d["containerEdits"].get("env", [])]
            assert sorted(env) == ["NEURON_LOGICAL_NC_CONFIG=1", "NEURON_RT_VISIBLE_CORES=0-63"]
            # the same claims again over the older API version: same answer
            again: Any = await conn.prepare(("ns", "u-row", "row"), version="v1beta1.DRAPlugin")
            assert [list(d.cdi_device_ids) for d in again["u-row"].devices] == [
                list(d.cdi_device_ids) for d in resp["u-row"].devices]
            metric = service.registry.get_sample_value
            assert metric("neuron_dra_prepared_claims") == 2 and metric("neuron_dra_prepared_devices") == 12
            assert metric("accel_dra_claim_operations_total",
                          {"driver": DRIVER, "operation": "prepare", "result": "error"}) == 1
            assert metric("neuron_dra_claim_read_duration_seconds_count") == 3
            # a claim overlapping a prepared one is refused, naming the device
            allocate(rig.reader, "u-dup", "dup", [7])
            dup: Any = await conn.prepare(("ns", "u-dup", "dup"))
            assert "neuron-device-7 is already prepared for claim ns/row" in dup["u-dup"].error
            # unprepare: the claim is already gone from the API server
            rig.reader.claims.clear()
            un: Any = await conn.unprepare(("ns", "u-row", "row"), ("ns", "u-lnc", "lnc"), ("ns", "u-x", "x"))
            assert {k: v.error for k, v in un.items()} == {"u-row": "", "u-lnc": "", "u-x": ""}
            assert list(rig.paths.cdi_root.iterdir()) == []
            assert service.store.claims() == []
            assert metric("neuron_dra_prepared_devices") == 0
            await conn.close()
        assert socket_files(rig.standin.registry_dir) == [], "sockets removed on stop"

    asyncio.run(scenario())


async def _next(stream: Any, check: Any, what: str) -> Any:
    """Read health messages until one satisfies ``check`` (periodic refreshes may come in between)."""
    async def loop() -> Any:
        while True:
            msg = await stream.read()
            assert len(msg.devices) == 16, "each message is the complete list"
            states = {d.device.device_name: d for d in msg.devices}
            if check(states):
                return states
    try:
        return await asyncio.wait_for(loop(), 5)
    except TimeoutError as exc:
        raise AssertionError(f"no health message with {what}") from exc


def test_health_stream_follows_the_host(short_tmp: Path) -> None:
    rig = Rig(short_tmp, "trn1.32xlarge")

    async def scenario() -> None:
        async with rig.running(refresh=0.5) as service:
            slot = service.inventory.device(3)
            conn = await rig.standin.register_dra(DRIVER)
            stream = conn.watch_health()
            first = await _next(stream, lambda s: True, "any")
            assert all(d.health == hp.HEALTHY for d in first.values())
            assert {d.device.pool_name for d in first.values()} == {NODE}
            assert {d.health_check_timeout_seconds for d in first.values()} == {60}
            # nothing changes: the full list is still re-sent before the kubelet's timeout runs out
            await _next(stream, lambda s: all(d.health == hp.HEALTHY for d in s.values()), "a periodic refresh")
            rig.host.remove_neuron(3)
            gone = await _next(stream, lambda s: s["neuron-device-3"].health == hp.UNHEALTHY, "device 3 unhealthy")
            assert "neuron3" in gone["neuron-device-3"].message
            assert gone["neuron-device-4"].health == hp.HEALTHY
            vanished = service.inventory.device(3)
            assert not vanished.present
            assert (vanished.pci_address, vanished.pcie_root, vanished.numa_node) == (
                slot.pci_address, slot.pcie_root, slot.numa_node), "a vanished device keeps its slot attributes"
            rig.host.restore_neuron(3)
            rig.host.set_neuron_counter(9, "stats/hardware/sram_ecc_uncorrected/total", 1)
            healed = await _next(stream, lambda s: s["neuron-device-3"].health == hp.HEALTHY
                                 and s["neuron-device-9"].health == hp.UNHEALTHY, "device 3 back, 9 broken")
            assert "uncorrected" in healed["neuron-device-9"].message
            stream.cancel()
            await conn.close()

    asyncio.run(scenario())


def test_liveness_probe_checks_the_driver_sockets(short_tmp: Path) -> None:
    rig = Rig(short_tmp, "inf2.xlarge")

    async def scenario() -> None:
        async with rig.running() as service:
            assert service.liveness is not None and service.liveness.port
            port = service.liveness.port
            assert await _check(port, "liveness") == SERVING
            assert await _check(port, "") == SERVING
            try:
                await _check(port, "other")
                raise AssertionError("an unknown service must be NOT_FOUND")
            except grpc.aio.AioRpcError as exc:
                assert exc.code() == grpc.StatusCode.NOT_FOUND
            service.plugin.dra_socket.unlink()  # the kubelet could no longer reach us
            assert await _check(port, "liveness") == NOT_SERVING

    asyncio.run(scenario())


class _SlicesPublisher:
    """Stands in for the slice publisher: keeps the device names of the last set_devices call."""

    def __init__(self) -> None:
        self.names: list[str] = []
        self.changed = asyncio.Event()

    def set_devices(self, devices: Any, *_: object) -> None:
        names = [d.name for d in devices]
        if names != self.names:
            self.names = names
            self.changed.set()

    async def run(self, stop: asyncio.Event) -> None:
        await stop.wait()


def test_the_dra_driver_wins_beside_the_device_plugin(short_tmp: Path) -> None:
    """The DRA driver never stands down for the device plugin: it prepares claims with the device plugin's socket on
    the node, and leaves out of its slices only the chip a running pod holds through ``aws.amazon.com/neuroncore``
    (from the kubelet's PodResources), until that pod ends.

    Expected values from the AWS Neuron device plugin's ID scheme (neuroncore ID = device index * logical cores per
    device + local core) and trn2's 8 NeuronCores per chip at the default LNC 2 (4 logical cores per chip): core 13
    is on chip 3."""
    rig = Rig(short_tmp, "trn2.48xlarge")
    plugins = rig.paths.device_plugins_dir
    plugins.mkdir(parents=True)
    sock = socket.socket(socket.AF_UNIX)
    sock.bind(str(plugins / "neuron-devplugin.sock"))
    holder = pr.PodResources(name="old-workload", namespace="default", containers=[pr.ContainerResources(
        name="main", devices=[pr.ContainerDevices(resource_name="aws.amazon.com/neuroncore", device_ids=["13"])])])

    async def published(publisher: _SlicesPublisher, predicate: Any) -> list[str]:
        async with asyncio.timeout(15):
            while not predicate(publisher.names):
                publisher.changed.clear()
                await publisher.changed.wait()
        return publisher.names

    async def scenario() -> None:
        await rig.standin.start(pod_resources=True)
        rig.standin.pod_resources = [holder]
        publisher = _SlicesPublisher()
        async with rig.running(publisher=publisher) as service:
            names = await published(publisher, lambda n: len(n) == 15)
            assert "neuron-device-3" not in names and "neuron-device-2" in names
            assert service.held == {"neuron-device-3"}
            conn = await rig.standin.register_dra(DRIVER)
            allocate(rig.reader, "u-1", "c1", [0])
            ok: Any = await conn.prepare(("ns", "u-1", "c1"))
            assert ok["u-1"].error == ""  # the device plugin's socket does not stop the driver
            rig.standin.pod_resources = []  # the old workload ended
            names = await published(publisher, lambda n: len(n) == 16)
            assert "neuron-device-3" in names
            await conn.close()
        await rig.standin.stop()

    try:
        asyncio.run(scenario())
    finally:
        sock.close()


def test_restart_restores_claims_and_lost_specs(short_tmp: Path) -> None:
    rig = Rig(short_tmp, "trn1.32xlarge")

    async def scenario() -> None:
        async with rig.running(pod_uid="pod-1"):
            conn = await rig.standin.register_dra(DRIVER)
            allocate(rig.reader, "u-1", "c1", [0, 1, 2, 3])
            first: Any = await conn.prepare(("ns", "u-1", "c1"))
            assert first["u-1"].error == ""
            await conn.close()
        spec_u1 = rig.paths.cdi_root / "k8s.neuron.aws.com-claim_u-1.json"
        # a prepare killed after its spec and before its checkpoint write left an orphan spec (and a temp file)
        orphan = rig.paths.cdi_root / "k8s.neuron.aws.com-claim_u-killed.json"
        orphan.write_bytes(spec_u1.read_bytes())
        temp = rig.paths.cdi_root / ".tmp-k8s.neuron.aws.com-claim_u-killed.json-abcd1234"
        temp.write_text("{")
        spec_u1.unlink()  # the node rebooted: /var/run is empty
        rig.host.set_boot_id("00000000-1111-2222-3333-444444444444")
        rig.reader.claims.clear()  # and nothing may be read again
        async with rig.running(pod_uid="pod-2") as service:
            assert [c.uid for c in service.store.claims()] == ["u-1"]
            assert not orphan.exists() and not temp.exists(), "start removed what no checkpoint entry refers to"
            spec = await _spec(rig.paths, "u-1")
            assert [n["path"] for d in spec["devices"] for n in d["containerEdits"].get("deviceNodes", [])] == [
                f"/dev/neuron{i}" for i in range(4)]
            conn = await rig.standin.register_dra(DRIVER)
            again: Any = await conn.prepare(("ns", "u-1", "c1"))
            assert [list(d.cdi_device_ids) for d in again["u-1"].devices] == [
                list(d.cdi_device_ids) for d in first["u-1"].devices]
            await _spec(rig.paths, "u-1", again["u-1"].devices)
            await conn.close()

    asyncio.run(scenario())


class _RecordingPublisher:
    """Stands in for the slice publisher: records when it was started (the API server side is tested elsewhere)."""

    def __init__(self) -> None:
        self.started = asyncio.Event()

    def set_devices(self, *_: object) -> None:
        pass

    async def run(self, stop: asyncio.Event) -> None:
        self.started.set()
        await stop.wait()


def test_slices_wait_for_the_kubelet_to_register_the_plugin(short_tmp: Path) -> None:
    """With a registration wait, nothing is published while the kubelet has not registered the plugin (the real
    kubelet refuses a prepare for an unregistered driver, and the scheduler could place a pod on these slices);
    the slices go out as soon as it has."""
    rig = Rig(short_tmp)

    async def scenario() -> None:
        publisher = _RecordingPublisher()
        async with rig.running(registration_wait=30, publisher=publisher):
            await asyncio.sleep(1.0)
            assert not publisher.started.is_set(), "published before the kubelet registered the plugin"
            conn = await rig.standin.register_dra(DRIVER)
            await asyncio.wait_for(publisher.started.wait(), 5)
            await conn.close()

    asyncio.run(scenario())


def test_without_a_kubelet_the_slices_go_out_after_the_wait(short_tmp: Path) -> None:
    rig = Rig(short_tmp)

    async def scenario() -> None:
        publisher = _RecordingPublisher()
        async with rig.running(registration_wait=0.5, publisher=publisher):
            await asyncio.wait_for(publisher.started.wait(), 10)

    asyncio.run(scenario())
