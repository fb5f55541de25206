"""A small asyncio HTTP/1.1 server for JSON endpoints: bounded heads and bodies, keep-alive, clear 4xx answers.

Handlers get ``(method, path, query, body)`` and return ``(status, body, content type)``. A request that is not
well-formed HTTP gets 400, an unknown path 404, a body over ``max_body`` 413, a missing Content-Length on POST 411;
none of them ends the server, and a handler that raises gets a 500 with the error logged.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from http import HTTPStatus
from urllib.parse import parse_qs, urlsplit

from accel_core.logs import kv

log = logging.getLogger(__name__)

Response = tuple[int, bytes, str]
Handler = Callable[[str, str, dict[str, list[str]], bytes], Awaitable[Response]]

MAX_HEAD = 16384
JSON = "application/json"
TEXT = "text/plain; charset=utf-8"


class HttpServer:
    def __init__(self, handler: Handler, address: str, port: int, *, max_body: int = 64 << 20,
                 request_timeout: float = 30.0) -> None:
        self.handler = handler
        self.address = address
        self.port = port
        self.max_body = max_body
        self.request_timeout = request_timeout
        self._server: asyncio.Server | None = None

    async def start(self) -> int:
        self._server = await asyncio.start_server(self._serve, self.address, self.port, limit=MAX_HEAD)
        self.port = self._server.sockets[0].getsockname()[1]
        return self.port

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._server.wait_closed(), 2.0)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                try:
                    keep = await asyncio.wait_for(self._one(reader, writer), self.request_timeout)
                except TimeoutError:
                    break
                if not keep:
                    break
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()

    async def _one(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bool:
        try:
            head = await reader.readuntil(b"\r\n\r\n")
        except asyncio.LimitOverrunError:
            await _send(writer, 431, b"request head too large\n", TEXT, False)
            return False
        except asyncio.IncompleteReadError:
            return False
        lines = head.decode("latin-1").split("\r\n")
        parts = lines[0].split(" ")
        if len(parts) != 3 or not parts[2].startswith("HTTP/1."):
            await _send(writer, 400, b"malformed request line\n", TEXT, False)
            return False
        method, target, version = parts
        headers: dict[str, str] = {}
        for line in lines[1:]:
            if line:
                name, sep, value = line.partition(":")
                if not sep:
                    await _send(writer, 400, b"malformed header line\n", TEXT, False)
                    return False
                headers[name.strip().lower()] = value.strip()
        keep = headers.get("connection", "").lower() != "close" and version == "HTTP/1.1"
        body = b""
        if "transfer-encoding" in headers:
            await _send(writer, 411, b"chunked bodies are not accepted; send Content-Length\n", TEXT, False)
            return False
        length_text = headers.get("content-length")
        if length_text is not None:
            if not length_text.isdigit():
                await _send(writer, 400, b"bad Content-Length\n", TEXT, False)
                return False
            length = int(length_text)
            if length > self.max_body:
                await _send(writer, 413, f"body over {self.max_body} bytes\n".encode(), TEXT, False)
                return False
            body = await reader.readexactly(length)
        elif method == "POST":
            await _send(writer, 411, b"POST needs Content-Length\n", TEXT, False)
            return False
        url = urlsplit(target)
        try:
            status, payload, ctype = await self.handler(method, url.path, parse_qs(url.query), body)
        except Exception as exc:  # a handler bug must not end the server
            log.exception("request handler failed", extra=kv(path=url.path[:80], error=repr(exc)[:200]))
            status, payload, ctype = 500, f"internal error: {exc!r}"[:500].encode() + b"\n", TEXT
        await _send(writer, status, payload if method != "HEAD" else b"", ctype, keep, len(payload))
        return keep


async def _send(writer: asyncio.StreamWriter, status: int, body: bytes, ctype: str, keep: bool,
                length: int | None = None) -> None:
    reason = HTTPStatus(status).phrase if status in HTTPStatus._value2member_map_ else "Status"
    head = (f"HTTP/1.1 {status} {reason}\r\nContent-Type: {ctype}\r\n"
            f"Content-Length: {len(body) if length is None else length}\r\n"
            f"Connection: {'keep-alive' if keep else 'close'}\r\n\r\n")
    writer.write(head.encode("latin-1") + body)
    await writer.drain()
