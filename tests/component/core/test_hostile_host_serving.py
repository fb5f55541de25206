"""Issue 14 item 1, while serving: hostile files appearing under a running ``efa-device-plugin serve`` and
``neuron-device-plugin serve`` (real processes, kubelet stand-in over real sockets) affect only their own device;
the daemon keeps running, keeps the other devices Healthy, keeps answering scrapes, and recovers when the files do.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import IO

from accel_rig.kubelet_standin import KubeletStandIn
from accel_rig.polling import poll_until, until
from hostcache import copy_host, shared_host

from accel_core.fakehost import FakeHost

REPO = Path(__file__).resolve().parents[3]
EFA = "vpc.amazonaws.com/efa"
NEURON = "aws.amazon.com/neuron"
PROBLEM, RESOLVED = 'msg="host problem" ', 'msg="host problem resolved"'


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def break_file(path: Path, how: str) -> None:
    """Replace one file the way a hostile or broken host might."""
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    elif os.path.lexists(path):
        path.unlink()
    if how == "superscript":
        path.write_text("²\n")
    elif how == "fullwidth":
        path.write_text("１\n")
    elif how == "binary":
        path.write_bytes(b"\xff\xfe\x00garbage")
    elif how == "huge":
        path.write_bytes(b"7" * 10_000)
    elif how == "fifo":
        os.mkfifo(path)
    elif how == "loop":
        os.symlink(path.name, path)
    elif how == "directory":
        path.mkdir()


HOW = ("superscript", "fullwidth", "binary", "huge", "fifo", "loop", "directory")
#: EFA port counters of the fake host, one per way of breaking a file
COUNTERS = ("tx_bytes", "rx_bytes", "tx_pkts", "rx_pkts", "send_bytes", "recv_bytes", "send_wrs")
UNREADABLE = 'msg="EFA counter unreadable; skipped in metrics"'


def scrape(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:  # noqa: S310 - loopback
        return resp.read().decode()


def read_errors(text: str, device: str) -> float:
    """The device's ``efa_counter_read_errors_total`` sample in a scrape (0 before the first error)."""
    prefix = f'efa_counter_read_errors_total{{device="{device}"}} '
    return next((float(line.removeprefix(prefix)) for line in text.splitlines() if line.startswith(prefix)), 0.0)


async def until_read_errors_above(port: int, device: str, count: float, timeout: float = 10.0) -> None:
    """The scrape is a blocking HTTP GET: polled from a worker thread, not the event loop."""
    await asyncio.to_thread(poll_until, lambda: read_errors(scrape(port), device) > count,
                            f"a new read error counted for {device} in /metrics", timeout, 0.2)


class StderrLines:
    """Collects a daemon's stderr lines as they come (a reader thread), for waits on what it logs."""

    def __init__(self, proc: subprocess.Popen[bytes]) -> None:
        assert proc.stderr is not None
        self.lines: list[str] = []
        self._thread = threading.Thread(target=self._read, args=(proc.stderr,), daemon=True)
        self._thread.start()

    def _read(self, stream: IO[bytes]) -> None:
        for raw in stream:
            self.lines.append(raw.decode(errors="replace"))

    def count(self, text: str) -> int:
        return sum(text in line for line in list(self.lines))

    def text(self) -> str:
        self._thread.join(timeout=5)
        return "".join(self.lines)


def health(devices: list, ids: Callable[[str], bool]) -> dict[str, str]:  # type: ignore[type-arg]
    return {d.ID: d.health for d in devices if ids(d.ID)}


async def serve(cmd: list[str], standin: KubeletStandIn, log_level: str = "WARNING") -> subprocess.Popen[bytes]:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.Popen([sys.executable, "-m", *cmd, *standin.daemon_flags(), "--log-level", log_level], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


async def stop(proc: subprocess.Popen[bytes], logged: StderrLines | None = None) -> str:
    proc.send_signal(signal.SIGTERM)
    code = await asyncio.to_thread(proc.wait, 20)
    err = logged.text() if logged is not None else (proc.stderr.read().decode() if proc.stderr else "")
    assert code == 0, err
    assert "Traceback" not in err, err
    return err


def test_efa_serve_keeps_the_other_devices_through_hostile_files(short_tmp: Path) -> None:
    async def scenario() -> None:
        host = copy_host(short_tmp / "h", "p4d.24xlarge")
        victim = host.efa_ibdevs[1]
        pristine = shared_host("p4d.24xlarge").root  # the tree the copy came from; only read
        ib_rel = host.ibdev_dir(victim).relative_to(host.root)
        pci_rel = Path(os.path.realpath(host.ibdev_dir(victim) / "device")).relative_to(host.root)
        # files whose breaking makes the device Unhealthy (or go away)
        targets = [ib_rel / "ports/1/state", pci_rel / "numa_node",
                   Path(f"sys/class/infiniband_verbs/{host.uverbs_of(victim)}/dev"),
                   Path(f"sys/class/infiniband_verbs/{host.uverbs_of(victim)}/ibdev")]
        # a counter only drops out of the metrics; counters are read when /metrics takes a snapshot (at most every
        # 2 s), so each way of breaking one goes to its own counter file and all are read in one snapshot
        counters = dict(zip(HOW, [ib_rel / "ports/1/hw_counters" / name for name in COUNTERS], strict=True))
        standin = KubeletStandIn(short_tmp / "k")
        await standin.start()
        port = free_port()
        proc = await serve(["efa_plugin.cli", "serve", "--host-root", str(host.root), "--rescan-interval", "0.1",
                            "--metrics-port", str(port)], standin)
        logged = StderrLines(proc)
        try:
            await standin.wait_registered(EFA, timeout=30)
            devices = await standin.wait_devices(EFA, lambda d: len(d) == 4 and all(x.health == "Healthy" for x in d))
            ids = sorted(d.ID for d in devices)
            victim_id = next(i for i in ids if (host.root / pci_rel).name == i)
            others = [i for i in ids if i != victim_id]
            for target in targets:
                for how in HOW:
                    break_file(host.root / target, how)
                    # the victim goes Unhealthy or away; the others stay Healthy and listed
                    await standin.wait_devices(EFA, lambda d: health(d, others.__contains__) == dict.fromkeys(
                        others, "Healthy") and health(d, victim_id.__eq__) != {victim_id: "Healthy"}, timeout=10)
                    assert proc.poll() is None
                    text = await asyncio.to_thread(scrape, port)
                    assert 'efa_device_healthy{device="' in text
                    restore(pristine, host, target)
                    await standin.wait_devices(EFA, lambda d: len(d) == 4 and all(x.health == "Healthy" for x in d),
                                               timeout=10)
            errors_before = read_errors(await asyncio.to_thread(scrape, port), victim)
            for how, counter in counters.items():
                break_file(host.root / counter, how)
            # a scrape's snapshot reads every counter: one read error per broken file, and each broken file logged
            # as unreadable (once per path); meanwhile every device stays listed and Healthy
            await until_read_errors_above(port, victim, errors_before + len(counters) - 1)
            for how, counter in counters.items():
                await until(lambda c=counter: any(UNREADABLE in line and f"/hw_counters/{c.name}" in line
                                                  for line in list(logged.lines)), f"{counter.name} ({how}) logged")
            assert proc.poll() is None
            assert health(standin.plugins[EFA].devices, bool) == dict.fromkeys(ids, "Healthy")
            for counter in counters.values():
                restore(pristine, host, counter)
            await stop(proc, logged)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            await standin.stop()

    asyncio.run(scenario())


def test_neuron_serve_keeps_the_other_devices_through_hostile_files(short_tmp: Path) -> None:
    async def scenario() -> None:
        host = copy_host(short_tmp / "h", "trn1.32xlarge")
        pristine = shared_host("trn1.32xlarge").root  # the tree the copy came from; only read
        base = Path("sys/devices/virtual/neuron_device/neuron3")
        targets = [base / "core_count", base / "connected_devices", base / "stats/hardware/mem_ecc_uncorrected/total"]
        standin = KubeletStandIn(short_tmp / "k")
        await standin.start()
        port = free_port()
        # INFO: the daemon logs each new host problem (WARNING) and its resolution (INFO) once, on the rescan that
        # read the file; those lines are the events this test waits for
        proc = await serve(["neuron_dra.deviceplugin.cli", "serve", "--host-root", str(host.root),
                            "--rescan-interval", "0.1", "--metrics-port", str(port)], standin, log_level="INFO")
        logged = StderrLines(proc)
        others = [str(i) for i in range(16) if i != 3]
        try:
            await standin.wait_registered(NEURON, timeout=30)
            await standin.wait_devices(NEURON, lambda d: len(d) == 16 and all(x.health == "Healthy" for x in d),
                                       timeout=10)
            for target in targets:
                for how in HOW:
                    appeared, resolved = logged.count(PROBLEM), logged.count(RESOLVED)
                    break_file(host.root / target, how)
                    await until(lambda n=appeared: logged.count(PROBLEM) > n, f"the daemon reading {target} ({how})")
                    devices = await standin.wait_devices(
                        NEURON, lambda d: len(d) == 16 and health(d, others.__contains__) == dict.fromkeys(
                            others, "Healthy"), timeout=10)
                    assert proc.poll() is None, (target, how)
                    assert len(devices) == 16
                    assert "neuron_device_plugin_device_healthy" in await asyncio.to_thread(scrape, port)
                    restore(pristine, host, target)
                    await until(lambda n=resolved: logged.count(RESOLVED) > n, f"{target} ({how}) resolved")
            await standin.wait_devices(NEURON, lambda d: len(d) == 16 and all(x.health == "Healthy" for x in d),
                                       timeout=10)
            await stop(proc, logged)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            await standin.stop()

    asyncio.run(scenario())


def restore(pristine: Path, host: FakeHost, rel: Path) -> None:
    path = host.root / rel
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    elif os.path.lexists(path):
        path.unlink()
    shutil.copy2(pristine / rel, path, follow_symlinks=False)
