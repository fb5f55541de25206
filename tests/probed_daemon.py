"""A device-plugin daemon as its own process under rig/accel_rig/heapprobe.py, served by the kubelet stand-in:
what the kubelet-restart memory test and benches restart and measure (tests/component/core/test_kubelet_restart_heap.py,
bench/bench_kubelet_restarts.py), and the daemons and fake hosts they use (bench/bench_real_kubelet_restarts.py too).
"""

from __future__ import annotations

import asyncio
import os
import subprocess
from pathlib import Path

import psutil
from accel_rig.heapprobe import sample, wrap
from accel_rig.kubelet_standin import KubeletStandIn
from hostcache import copy_host

REPO = Path(__file__).resolve().parents[1]

#: console script -> (instance type of its fake host, the resources it registers)
DAEMONS = {
    "efa-device-plugin": ("p4d.24xlarge", ("vpc.amazonaws.com/efa",)),
    "neuron-device-plugin": ("trn1.32xlarge", ("aws.amazon.com/neuron", "aws.amazon.com/neuroncore")),
}


class ProbedDaemon:
    """``async with ProbedDaemon(tmp, script) as daemon``: the daemon serves on a fake host of its instance type
    (``itype`` overrides it) and has registered every resource; ``env`` adds to its environment."""

    def __init__(self, tmp: Path, script: str, itype: str | None = None, env: dict[str, str] | None = None) -> None:
        self.tmp, self.script, self.env = tmp, script, env or {}
        default_type, self.resources = DAEMONS[script]
        self.itype = itype or default_type
        self.standin = KubeletStandIn(tmp / "k")
        self.heap = tmp / "heap.txt"

    async def __aenter__(self) -> ProbedDaemon:
        host = copy_host(self.tmp / "h", self.itype)
        await self.standin.start(pod_resources=True)
        path = os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])
        self.proc = subprocess.Popen(
            wrap(self.heap, self.script, "serve", "--host-root", str(host.root), *self.standin.daemon_flags(),
                 "--metrics-port", "0", "--log-level", "WARNING"),
            env={**os.environ, "PYTHONPATH": path, **self.env}, stderr=subprocess.DEVNULL)
        self.process = psutil.Process(self.proc.pid)
        for resource in self.resources:
            await self.standin.wait_registered(resource, timeout=60)
        self.standin.registrations.clear()
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.proc.terminate()
        self.proc.wait(30)
        await self.standin.stop()

    async def restart_kubelet(self, streams_up: bool = True, settle: float = 0.0) -> None:
        """One kubelet restart, done once every resource is registered again (and, with ``streams_up``, has its
        first device list), then ``settle`` seconds."""
        await self.standin.restart()
        for resource in self.resources:
            await self.standin.wait_registered(resource, timeout=30)
            if streams_up:
                await self.standin.wait_devices(resource, bool, timeout=30)
        if settle:
            await asyncio.sleep(settle)
        self.standin.registrations.clear()  # the stand-in's own record, not the daemon's memory

    async def heap_in_use(self) -> int:
        """One heapprobe reading, taken off the event loop."""
        return await asyncio.to_thread(sample, self.proc.pid, self.heap)

    def threads(self) -> set[int]:
        return {thread.id for thread in self.process.threads()}
