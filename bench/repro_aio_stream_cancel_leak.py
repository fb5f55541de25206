"""grpcio's asyncio leak behind the neuron daemon's growth in bench_kubelet_restarts.py (issue 25 item 9), with none
of the daemon's code: a grpc.aio server whose ListAndWatch sends one 128-device list and then waits, a client that
opens the stream and ends it, channel closed, server stopped (grace 0.2), over and over. Prints the native heap in
use (glibc mallinfo2) per cycle after a warm-up, for two clients:

- ``read``: the client reads the first list, then cancels (a kubelet restart after the stream has been up);
- ``abrupt``: the client cancels at once, as the kubelet stand-in does when it restarts right after a Register,
  usually while gRPC still has the stream's first read or write under way.

    PYTHONPATH=. .venv/bin/python bench/repro_aio_stream_cancel_leak.py [--cycles 1500]

With grpcio 1.85.3 on a 2-core Linux machine (glibc), ``read`` keeps ~20 B/cycle and ``abrupt`` leaks ~450 B/cycle:
an aio batch whose awaiting task is cancelled, or which fails, never frees its ``grpc_op`` array nor releases its
operations (grpc/grpc#43360; fixes proposed in grpc/grpc#43361 and #43409). When a grpcio release fixes it,
``abrupt`` falls to the level of ``read``, and so does the neuron daemon in the default mode of the benchmark.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import tempfile
from collections.abc import AsyncIterator
from typing import Any

os.environ.setdefault("GRPC_VERBOSITY", "ERROR")  # one GOAWAY line per cycle otherwise

import grpc  # noqa: E402
from accel_rig.heapprobe import heap_in_use  # noqa: E402

from accel_core.kubeletapi import deviceplugin_v1beta1_pb2 as pb  # noqa: E402
from accel_core.kubeletapi import deviceplugin_v1beta1_pb2_grpc as pb_grpc  # noqa: E402

LIST = pb.ListAndWatchResponse(devices=[
    pb.Device(ID=f"neuroncore-{i}", health="Healthy", topology=pb.TopologyInfo(nodes=[pb.NUMANode(ID=i % 2)]))
    for i in range(128)])


class _Plugin(pb_grpc.DevicePluginServicer):
    async def ListAndWatch(self, request: pb.Empty, context: Any) -> AsyncIterator[pb.ListAndWatchResponse]:  # noqa: N802
        yield LIST
        await asyncio.Event().wait()


async def cycle(path: str, read_first: bool) -> None:
    server = grpc.aio.server()
    pb_grpc.add_DevicePluginServicer_to_server(_Plugin(), server)
    server.add_insecure_port(f"unix://{path}")
    await server.start()
    channel = grpc.aio.insecure_channel(f"unix://{path}")
    call = pb_grpc.DevicePluginStub(channel).ListAndWatch(pb.Empty())
    if read_first:
        await call.read()
    else:  # the stand-in's way: a task follows the stream and is cancelled right away
        async def follow() -> None:
            async for _ in call:
                pass

        task = asyncio.ensure_future(follow())
        await asyncio.sleep(0)
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError, grpc.aio.AioRpcError):
            await task
    call.cancel()
    await channel.close(None)
    await server.stop(0.2)
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)


async def measure(read_first: bool, cycles: int, warmup: int) -> float:
    path = os.path.join(tempfile.mkdtemp(prefix="aio-leak-"), "plugin.sock")
    for _ in range(warmup):
        await cycle(path, read_first)
    before = heap_in_use()
    for _ in range(cycles):
        await cycle(path, read_first)
    return (heap_in_use() - before) / cycles


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cycles", type=int, default=1500)
    parser.add_argument("--warmup", type=int, default=200)
    args = parser.parse_args()
    for name, read_first in (("read", True), ("abrupt", False)):
        per_cycle = asyncio.run(measure(read_first, args.cycles, args.warmup))
        print(f"{name}: {per_cycle:+.0f} B/cycle of native heap in use (grpcio {grpc.__version__})")


if __name__ == "__main__":
    main()
