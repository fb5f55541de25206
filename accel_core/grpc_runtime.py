"""Keep gRPC's runtime up for a daemon's whole run.

grpcio counts its users: every aio server and channel holds gRPC's runtime, and when the last one closes, gRPC
shuts down its thread pools, timer thread and poller. A device plugin closes its server and its registration
channel on every kubelet restart, so for a moment it held nothing, and each restart tore the runtime down and built
it again: about seven new threads per restart (each one could get a malloc arena of its own), which grew RSS by
~0.4 MB over a few hundred restarts (docs/benchmarks.md, "Kubelet restarts"). :func:`hold_grpc_runtime` holds one
idle channel for the run; it never connects (no RPC is made on it), so it costs no socket and no thread of its own.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

import grpc

#: never dialled: a channel connects only for an RPC or when asked to
_IDLE_TARGET = "unix:///dev/null"


@contextlib.asynccontextmanager
async def hold_grpc_runtime() -> AsyncIterator[None]:
    """Hold gRPC's runtime (its threads) from entry to exit, whatever servers and channels come and go meanwhile."""
    channel = grpc.aio.insecure_channel(_IDLE_TARGET)
    try:
        yield
    finally:
        await channel.close(None)
