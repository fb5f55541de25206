"""The DRA drivers' health poll: a health file that changes in place without an event, as on real sysfs (a Neuron
uncorrected-error counter rising, an EFA port going DOWN), reaches the kubelet's health stream and the published
taint within about a second while the next full rescan is a minute away: the poll carried it, not the rescan. A
vanished /dev node is seen as fast (an event, not the rescan), and with rescans that far apart the kubelet still
gets the full list before its reports time out."""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import AsyncIterator, Callable, Sequence
from pathlib import Path
from typing import Any

from accel_rig.polling import until
from drarig import served_paths
from hostcache import copy_host

from accel_core.dra.daemon import DEFAULT_HEALTH_POLL_INTERVAL, DraService, ServiceSettings
from accel_core.dra.profile import DraProfile, Scan
from accel_core.dra.slicemodel import CounterSet, SliceDevice
from accel_core.fakehost import FakeHost
from accel_core.kubeletapi import dra_health_v1alpha1_pb2 as hp
from accel_core.paths import HostPaths
from efa_plugin.discovery import EfaInventory
from efa_plugin.dra.profile import EfaProfile
from efa_plugin.scanner import EfaScanner
from neuron_dra.dra.profile import NeuronProfile

NODE = "node-a"
RESCAN = 60.0
#: Well below RESCAN; the poll itself comes every DEFAULT_HEALTH_POLL_INTERVAL (0.75 s).
WITHIN = 5.0


class Publisher:
    """Stands in for the slice publisher: keeps the device list the service last handed over."""

    def __init__(self) -> None:
        self.devices: dict[str, SliceDevice] = {}

    def set_devices(self, devices: Sequence[SliceDevice], counters: Sequence[CounterSet] = ()) -> None:
        self.devices = {d.name: d for d in devices}

    async def run(self, stop: asyncio.Event) -> None:
        await stop.wait()

    def taint(self, device: str) -> tuple[str, str, str] | None:
        taints = self.devices[device].taints
        return (taints[0].key, taints[0].value, taints[0].effect) if taints else None


class SysfsLikeEfaScanner(EfaScanner):
    """No watch on the port state directories: on real sysfs a port going down raises no event, while on the fake
    host the write would (and inotify, not the poll, would carry the change)."""

    def watch_paths(self, paths: HostPaths, inventory: EfaInventory) -> list[Path]:
        return [p for p in super().watch_paths(paths, inventory) if p.name != "state"]


def write_in_place(path: Path, text: str) -> None:
    """Change a file as sysfs changes an attribute: same inode, no rename, and never seen empty or half-written.
    Truncate-then-write would let the 0.75 s poll read an empty file in between (a "malformed" host problem and one
    more scan than the change itself); instead one write over the old bytes, a shorter value padded with blanks
    before its newline (the readers strip them)."""
    fd = os.open(path, os.O_RDWR)
    try:
        old = os.fstat(fd).st_size
        body = text.rstrip("\n")
        data = (body.ljust(old - 1) + "\n").encode() if len(text) < old else text.encode()
        os.pwrite(fd, data, 0)
    finally:
        os.close(fd)


class CountingService(DraService):
    """The service, counting its host scans (each once done: its poll baseline taken, its devices handed over)."""

    scans = 0

    async def rescan(self) -> Scan[Any]:
        scan = await super().rescan()
        self.scans += 1
        return scan


class Rig:
    """One DRA service on a fake host, its full rescans a minute apart, registered with the kubelet stand-in
    (``health`` is its open health stream); counts the service's scans."""

    def __init__(self, root: Path, profile: DraProfile[Any, Any], **kwargs: Any) -> None:
        self.standin, self.paths = served_paths(root, root / "h")
        self.publisher = Publisher()
        self.service = CountingService(profile, self.paths, ServiceSettings(
            node_name=NODE, pod_uid="pod-1", healthcheck_port=-1, rescan_interval=RESCAN, **kwargs),
            publisher=self.publisher)
        self.health: Any = None

    @property
    def scans(self) -> int:
        return self.service.scans

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[Rig]:
        stop = asyncio.Event()
        task = asyncio.create_task(self.service.run(stop))
        try:
            await asyncio.wait_for(self.service.ready.wait(), 10)
            conn = await self.standin.register_dra(self.service.driver_name)
            self.health = conn.watch_health()
            # the start-up scan and the one right after arming the watches: from here on only an event, the poll
            # or the rescan a minute away scans again
            await until(lambda: self.scans >= 2, "the first two scans")
            try:
                yield self
            finally:
                self.health.cancel()
                await conn.close()
        finally:
            stop.set()
            await asyncio.wait_for(task, 10)

    async def next_health(self, check: Callable[[dict[str, Any]], bool], what: str) -> dict[str, Any]:
        """The next health message (device name -> state) that satisfies ``check``, within WITHIN seconds."""
        async def read() -> dict[str, Any]:
            while True:
                msg = await self.health.read()
                states = {d.device.device_name: d for d in msg.devices}
                if check(states):
                    return states

        try:
            return await asyncio.wait_for(read(), WITHIN)
        except TimeoutError as exc:
            raise AssertionError(f"no health message with {what} within {WITHIN} s") from exc


async def poll_carries(rig: Rig, health_file: Path, new_text: str, device: str) -> dict[str, Any]:
    """Change ``health_file`` in place once the service runs; the first health message with ``device`` unhealthy."""
    async with rig.running():
        assert rig.service.health_poll_interval == DEFAULT_HEALTH_POLL_INTERVAL
        first = await rig.next_health(lambda s: True, "any")
        assert all(d.health == hp.HEALTHY for d in first.values())
        assert rig.publisher.taint(device) is None
        write_in_place(health_file, new_text)
        return await rig.next_health(lambda s: s[device].health == hp.UNHEALTHY, f"{device} unhealthy")


def test_a_rising_neuron_counter_reaches_the_kubelet_by_the_poll(short_tmp: Path) -> None:
    fake: FakeHost = copy_host(short_tmp / "h", "trn2.48xlarge")
    counter = fake.root / "sys/class/neuron_device/neuron5/stats/hardware/sram_ecc_uncorrected/total"
    write_in_place(counter, "0\n")  # a copy-on-write host tree copies the file up now, not while it is polled
    rig = Rig(short_tmp, NeuronProfile())
    states = asyncio.run(poll_carries(rig, counter, "2\n", "neuron-device-5"))
    assert len(states) == 16, "each message is the complete list"
    assert "2 uncorrected ECC errors" in states["neuron-device-5"].message
    assert [n for n, s in states.items() if s.health != hp.HEALTHY] == ["neuron-device-5"]
    assert rig.publisher.taint("neuron-device-5") == ("neuron.aws.com/unhealthy", "UncorrectedErrors", "NoSchedule")
    assert rig.publisher.taint("neuron-device-4") is None


def test_an_efa_port_going_down_reaches_the_kubelet_by_the_poll(short_tmp: Path) -> None:
    fake: FakeHost = copy_host(short_tmp / "h", "p4d.24xlarge")
    state = fake.ibdev_dir("rdmap16s27") / "ports" / "1" / "state"  # PCI 0000:10:1b.0 (efa.md section 2.2)
    write_in_place(state, "4: ACTIVE\n")  # copied up now, as above
    rig = Rig(short_tmp, EfaProfile(SysfsLikeEfaScanner()))
    states = asyncio.run(poll_carries(rig, state, "1: DOWN\n", "efa-0000-10-1b-0"))
    assert len(states) == 4, "p4d.24xlarge: 4 EFAs"
    assert "DOWN" in states["efa-0000-10-1b-0"].message
    assert [n for n, s in states.items() if s.health != hp.HEALTHY] == ["efa-0000-10-1b-0"]
    assert rig.publisher.taint("efa-0000-10-1b-0") == ("efa.aws.com/unhealthy", "PortDown", "NoSchedule")
    assert rig.publisher.taint("efa-0000-20-1b-0") is None


def test_a_vanished_neuron_dev_node_does_not_wait_for_the_rescan(short_tmp: Path) -> None:
    fake = copy_host(short_tmp / "h", "trn2.48xlarge")
    rig = Rig(short_tmp, NeuronProfile())

    async def scenario() -> dict[str, Any]:
        async with rig.running():
            await rig.next_health(lambda s: s["neuron-device-7"].health == hp.HEALTHY, "device 7 healthy")
            fake.remove_dev_node("/dev/neuron7")
            return await rig.next_health(lambda s: s["neuron-device-7"].health == hp.UNHEALTHY, "device 7 unhealthy")

    states = asyncio.run(scenario())
    assert "/dev/neuron7 is missing" in states["neuron-device-7"].message
    assert rig.publisher.taint("neuron-device-7") == ("neuron.aws.com/unhealthy", "DevNodeMissing", "NoSchedule")


def test_the_full_list_is_re_sent_while_the_host_stays_quiet(short_tmp: Path) -> None:
    """Each report times out after 60 s at the kubelet: the full list goes out every ``health_refresh_seconds``
    though nothing changes and the rescans are a minute apart, and re-sending it scans nothing."""
    copy_host(short_tmp / "h", "inf2.xlarge")
    rig = Rig(short_tmp, NeuronProfile(), health_refresh_seconds=0.3)

    async def scenario() -> None:
        async with rig.running():
            for _ in range(3):
                states = await rig.next_health(lambda s: True, "a periodic refresh")
                assert [(n, s.health) for n, s in states.items()] == [("neuron-device-0", hp.HEALTHY)]
            assert rig.scans == 2

    asyncio.run(scenario())


def test_noexecute_follows_the_hold_without_any_rescan(short_tmp: Path) -> None:
    """``--unhealthy-taint-effect NoExecute``: a port seen DOWN is NoSchedule at once and NoExecute once it stayed
    down ``noexecute_after`` seconds, from the service's own timer (no host event, no rescan, marks that moment);
    timeAdded is when it was first seen DOWN, and that plus the hold."""
    fake: FakeHost = copy_host(short_tmp / "h", "p4d.24xlarge")
    state = fake.ibdev_dir("rdmap16s27") / "ports" / "1" / "state"
    write_in_place(state, "4: ACTIVE\n")
    rig = Rig(short_tmp, EfaProfile(SysfsLikeEfaScanner()), taint_effect="NoExecute", noexecute_after=1.5)
    device = "efa-0000-10-1b-0"

    def taint() -> Any:
        taints = rig.publisher.devices[device].taints
        return taints[0] if taints else None

    async def scenario() -> None:
        async with rig.running():
            write_in_place(state, "1: DOWN\n")
            first = await until(taint, "the NoSchedule taint", timeout=WITHIN)
            assert first.effect == "NoSchedule"
            scans = rig.scans
            upgraded = await until(lambda: (t := taint()) is not None and t.effect == "NoExecute" and t,
                                   "the NoExecute taint", timeout=WITHIN)
            assert rig.scans == scans, "the timer, not a rescan"
            assert first.time_added is not None and upgraded.time_added is not None
            assert upgraded.time_added.timestamp() - first.time_added.timestamp() in (1, 2), "the hold, whole seconds"

    asyncio.run(scenario())
