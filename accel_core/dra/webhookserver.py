"""The HTTPS server of a DRA driver's admission webhook (``<driver> webhook``): ``POST /validate`` answers an
AdmissionReview (:mod:`accel_core.dra.admission`), ``GET /healthz`` says the server is up (the readiness probe).

TLS only: the API server calls webhooks over HTTPS and checks the certificate against the webhook configuration's
caBundle; it presents no client certificate, so none is asked for. The certificate and key are read once at start
(the chart rolls the pods when it renews them). A body over :data:`MAX_BODY` is refused before it is read; a
handler error is a logged 500, never the end of the server.
"""

from __future__ import annotations

import asyncio
import json
import logging
import ssl
from pathlib import Path

from aiohttp import web

from accel_core.dra.admission import BadReview, Decode, review
from accel_core.logs import kv

log = logging.getLogger(__name__)

#: An AdmissionReview holds the object (and, for UPDATE, the old one); etcd keeps objects under 1.5 MiB.
MAX_BODY = 8 << 20
PATH = "/validate"
#: Bodies up to this size are reviewed on the event loop (well under a millisecond); bigger ones in a thread.
INLINE_BODY = 64 << 10


class TlsFileError(ValueError):
    """The certificate or key cannot be used; the message names the files."""


def server_context(cert: Path, key: Path) -> ssl.SSLContext:
    """A TLS 1.2+ server context with ``cert`` and ``key`` (TlsFileError naming them)."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        ctx.load_cert_chain(cert, key)
    except (OSError, ssl.SSLError) as exc:
        why = getattr(exc, "strerror", None) or getattr(exc, "reason", None) or str(exc)
        raise TlsFileError(f"cannot use certificate {cert} with key {key}: {why}") from None
    return ctx


class WebhookServer:
    def __init__(self, driver: str, decode: Decode, address: str, port: int, ssl_context: ssl.SSLContext) -> None:
        self.driver = driver
        self.decode = decode
        self.address = address
        self.port = port
        self.ssl_context = ssl_context
        self._runner: web.AppRunner | None = None

    async def start(self) -> int:
        """Listen; returns the bound port (useful with port 0)."""
        app = web.Application(client_max_size=MAX_BODY)
        app.router.add_post(PATH, self._validate)
        app.router.add_get("/healthz", self._healthz)
        self._runner = web.AppRunner(app, access_log=None, handle_signals=False)
        await self._runner.setup()
        await web.TCPSite(self._runner, self.address, self.port, ssl_context=self.ssl_context).start()
        self.port = int(self._runner.addresses[0][1])
        log.info("admission webhook serving", extra=kv(driver=self.driver, address=self.address, port=self.port,
                                                       path=PATH))
        return self.port

    async def close(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def run(self, stop: asyncio.Event) -> None:
        await self.start()
        try:
            await stop.wait()
        finally:
            await self.close()

    async def _healthz(self, request: web.Request) -> web.Response:
        return web.Response(text="ok\n")

    async def _validate(self, request: web.Request) -> web.Response:
        try:
            body = await request.read()
        except web.HTTPRequestEntityTooLarge:
            return web.Response(status=413, text=f"body over {MAX_BODY} bytes\n")
        try:
            if len(body) > INLINE_BODY:  # a big object's JSON parse would hold up other reviews
                answer = await asyncio.to_thread(review, body, driver=self.driver, decode=self.decode)
            else:
                answer = review(body, driver=self.driver, decode=self.decode)
        except BadReview as exc:
            log.warning("bad admission request", extra=kv(error=str(exc)))
            return web.Response(status=400, text=f"{exc}\n")
        except Exception as exc:  # a decoder bug must not end the server; the API server applies failurePolicy
            log.exception("admission review failed", extra=kv(error=repr(exc)[:200]))
            return web.Response(status=500, text="internal error\n")
        return web.Response(body=json.dumps(answer).encode(), content_type="application/json")
