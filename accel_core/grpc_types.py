"""Type aliases for the gRPC asyncio API (the generated stubs are untyped)."""

from typing import Any

import grpc

Ctx = grpc.aio.ServicerContext[Any, Any]
