"""The extender's HTTP endpoint on aiohttp: JSON verbs in, ``(status, body, content type)`` out.

aiohttp parses HTTP/1.1 (keep-alive, chunked bodies, bounded request lines and headers, a 400 for anything
malformed); this module adds what the extender promises on top: a body over ``max_body`` gets 413 before any of it
is read, a POST without a length 411, a handler that raises a logged 500, and none of them ends the server.
Handlers get ``(method, path, query, body)`` and return ``(status, body, content type)``. With an ``ssl_context``
the server speaks only TLS (the context decides whether a client certificate is required, see tls.py).
"""

from __future__ import annotations

import logging
import ssl
from collections.abc import Awaitable, Callable
from typing import Any
from urllib.parse import parse_qs

from aiohttp import web

from accel_core.logs import kv

log = logging.getLogger(__name__)

Response = tuple[int, bytes, str]
Handler = Callable[[str, str, dict[str, list[str]], bytes], Awaitable[Response]]

#: longest request line and header line accepted (aiohttp answers 400 beyond)
MAX_LINE = 16384
JSON = "application/json"
TEXT = "text/plain; charset=utf-8"


class _OneLineErrors(logging.LoggerAdapter):  # type: ignore[type-arg]
    """aiohttp logs every malformed request with a traceback at ERROR; a hostile client could fill the log. Our
    handler errors are logged by :meth:`HttpServer._dispatch`, so what reaches here is the client's fault: one
    WARNING line naming it."""

    def exception(self, msg: object, *args: object, exc_info: Any = True, **kwargs: Any) -> None:
        reason = exc_info if isinstance(exc_info, BaseException) else None
        self.warning("bad HTTP request", extra=kv(detail=str(msg) % args if args else str(msg),
                                                   error=" ".join(repr(reason).split())[:200]))


class HttpServer:
    def __init__(self, handler: Handler, address: str, port: int, *, max_body: int = 64 << 20,
                 request_timeout: float = 30.0, ssl_context: ssl.SSLContext | None = None) -> None:
        self.handler = handler
        self.ssl_context = ssl_context
        self.address = address
        self.port = port
        self.max_body = max_body
        self.request_timeout = request_timeout
        self._runner: web.AppRunner | None = None

    async def start(self) -> int:
        """Listen; returns the bound port (useful with port 0)."""
        app = web.Application(client_max_size=self.max_body,
                              handler_args={"max_line_size": MAX_LINE, "max_field_size": MAX_LINE})
        app.router.add_route("*", "/{path:.*}", self._dispatch)
        self._runner = web.AppRunner(app, access_log=None, handle_signals=False,
                                     keepalive_timeout=self.request_timeout, lingering_time=0.5,
                                     logger=_OneLineErrors(log, {}))
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.address, self.port, ssl_context=self.ssl_context)
        await site.start()
        self.port = int(self._runner.addresses[0][1])
        return self.port

    async def close(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def _dispatch(self, request: web.Request) -> web.Response:
        length = request.content_length
        chunked = "chunked" in request.headers.get("Transfer-Encoding", "").lower()
        if length is not None and length > self.max_body:
            return _text(413, f"body over {self.max_body} bytes\n", close=True)  # answered before reading it
        if request.method == "POST" and length is None and not chunked:
            return _text(411, "POST needs Content-Length (or a chunked body)\n")
        try:
            body = await request.read()
        except web.HTTPRequestEntityTooLarge:
            return _text(413, f"body over {self.max_body} bytes\n", close=True)
        try:
            status, payload, ctype = await self.handler(request.method, request.path,
                                                        parse_qs(request.query_string), body)
        except Exception as exc:  # a handler bug must not end the server
            log.exception("request handler failed", extra=kv(path=request.path[:80], error=repr(exc)[:200]))
            return _text(500, f"internal error: {exc!r}"[:500] + "\n")
        return web.Response(status=status, body=payload, headers={"Content-Type": ctype})


def _text(status: int, message: str, *, close: bool = False) -> web.Response:
    response = web.Response(status=status, body=message.encode(), headers={"Content-Type": TEXT})
    if close:  # the unread body may still be on the wire: end the connection rather than parse it as a request
        response.force_close()
    return response
