"""Issue 14 item 7 against the real API server: after an outage long enough to have grown any backoff, ResourceSlices
deleted right after the API server returns are published again within a second.

The API server is really stopped and started again. A restarted control plane gets a new port (the old one is held
in TIME_WAIT), so the publisher reaches it through a plain TCP forwarder on a fixed port, the way clients reach a
real API server through a load balancer: the forwarder refuses connections during the outage and forwards to the
new port afterwards. TLS runs end to end through it.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import time
from pathlib import Path

import yaml
from accel_rig.controlplane import ControlPlane
from lightkube import AsyncClient, Client, KubeConfig
from lightkube.resources.resource_v1 import ResourceSlice

from accel_core.dra.publisher import SlicePublisher
from accel_core.dra.slicemodel import SliceDevice

DRIVER = "outage.example.com"
NODE = "outage-node"
OUTAGE_S = 12.0  # an exponential backoff from 0.5 s would be sleeping 8-16 s by the time the server is back


class TcpForwarder:
    """127.0.0.1:<port> -> 127.0.0.1:<upstream>; ``down()`` refuses and cuts connections, ``up()`` listens again on
    the same port."""

    def __init__(self, upstream: int) -> None:
        self.upstream = upstream
        self.port = 0
        self._server: asyncio.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()

    async def up(self) -> None:
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", self.port))
        self.port = sock.getsockname()[1]
        self._server = await asyncio.start_server(self._client, sock=sock)

    async def down(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
            self._server = None
        for writer in list(self._writers):
            writer.transport.abort()

    async def _client(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.upstream)
        except OSError:
            writer.transport.abort()
            return
        self._writers.update((writer, up_writer))

        async def pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
            with contextlib.suppress(OSError, asyncio.CancelledError):
                while data := await src.read(65536):
                    dst.write(data)
                    await dst.drain()
            dst.transport.abort()

        try:
            await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))
        finally:
            self._writers.difference_update((writer, up_writer))


def kubeconfig_via(source: Path, target: Path, port: int) -> Path:
    doc = yaml.safe_load(source.read_text())
    for cluster in doc["clusters"]:
        cluster["cluster"]["server"] = f"https://127.0.0.1:{port}"
    target.write_text(yaml.safe_dump(doc))
    return target


def our_slices(kubeconfig: Path) -> list[ResourceSlice]:
    with contextlib.closing(Client(KubeConfig.from_file(kubeconfig))) as client:
        return list(client.list(ResourceSlice, fields={"spec.driver": DRIVER, "spec.nodeName": NODE}))


def delete_ours(kubeconfig: Path) -> int:
    with contextlib.closing(Client(KubeConfig.from_file(kubeconfig))) as client:
        names = [o.metadata.name for o in client.list(ResourceSlice, fields={"spec.driver": DRIVER})
                 if o.metadata is not None and o.metadata.name]
        for name in names:
            client.delete(ResourceSlice, name)
        return len(names)


def test_slices_deleted_right_after_an_outage_come_back_within_a_second(tmp_path: Path, kube_binaries: Path) -> None:
    state = tmp_path / "cp"
    planes = [ControlPlane(state, bin_dir=kube_binaries, with_scheduler=False, with_controller_manager=False)]
    planes[0].start()
    try:
        planes[0].create_fake_node(NODE)

        async def scenario() -> tuple[float, float]:
            forwarder = TcpForwarder(planes[0].apiserver_port)
            await forwarder.up()
            kubeconfig = kubeconfig_via(planes[0].admin_kubeconfig, tmp_path / "via-forwarder.kubeconfig",
                                        forwarder.port)
            client = AsyncClient(KubeConfig.from_file(kubeconfig), field_manager="outage-test")
            publisher = SlicePublisher(client, DRIVER, NODE)
            stop = asyncio.Event()
            task = asyncio.create_task(publisher.run(stop))
            try:
                publisher.set_devices([SliceDevice(f"dev-{i}", {"index": i}) for i in range(3)])
                await asyncio.wait_for(publisher.published.wait(), 30)
                assert len(await asyncio.to_thread(our_slices, planes[0].admin_kubeconfig)) == 1

                # normal operation, for comparison: a deleted slice comes back at once
                await asyncio.to_thread(delete_ours, planes[0].admin_kubeconfig)
                t0 = time.monotonic()
                while not await asyncio.to_thread(our_slices, planes[0].admin_kubeconfig):
                    await asyncio.sleep(0.02)
                normal = time.monotonic() - t0

                await forwarder.down()
                await asyncio.to_thread(planes[0].stop)
                await asyncio.sleep(OUTAGE_S)
                assert publisher.metrics.errors.labels(DRIVER)._value.get() >= 5  # it kept trying meanwhile
                planes.append(ControlPlane(state, bin_dir=kube_binaries, with_scheduler=False,
                                           with_controller_manager=False))
                await asyncio.to_thread(planes[1].start)
                forwarder.upstream = planes[1].apiserver_port
                await forwarder.up()  # the API server is back at the address the driver knows

                assert await asyncio.to_thread(delete_ours, planes[1].admin_kubeconfig) == 1
                deleted = time.monotonic()
                while not await asyncio.to_thread(our_slices, planes[1].admin_kubeconfig):
                    assert time.monotonic() - deleted < 40, "the slices never came back"
                    await asyncio.sleep(0.02)
                return normal, time.monotonic() - deleted
            finally:
                stop.set()
                await asyncio.wait_for(task, 10)
                await client.close()
                await forwarder.down()

        normal, after_outage = asyncio.run(scenario())
        assert normal < 1.0
        assert after_outage < 1.0, f"republished {after_outage:.2f} s after the deletion (normally {normal:.2f} s)"
    finally:
        for plane in reversed(planes):
            plane.stop()
