"""The claim GET of the DRA prepare path (``accel_core.dra.claimget``) against a stand-in API server: which
kubeconfig users it serves (the rest go through lightkube), the bearer token and its rotation, and how answers other
than a claim become errors that name the problem. TLS and client certificates: test_dra_kube_client.py."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from lightkube import KubeConfig
from lightkube.config.kubeconfig import SingleConfig

from accel_core.dra.claimget import MAX_BODY_BYTES, DirectClaimGet
from accel_core.dra.types import ClaimError

CLAIM = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
         "metadata": {"name": "c", "namespace": "ns", "uid": "u-1"}, "spec": {"devices": {}}}
PATH = "/apis/resource.k8s.io/v1/namespaces/{ns}/resourceclaims/{name}"  # the resource.k8s.io/v1 REST path


def config(server: str, user: dict[str, Any]) -> SingleConfig:
    single = KubeConfig.from_dict({
        "clusters": [{"name": "c", "cluster": {"server": server}}], "users": [{"name": "u", "user": user}],
        "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}], "current-context": "x"}).get()
    assert single is not None
    return single


@asynccontextmanager
async def api(handler: Callable[[web.Request], Any]) -> AsyncIterator[str]:
    app = web.Application()
    app.router.add_get(PATH, handler)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        await runner.cleanup()


async def read_once(server: str, user: dict[str, Any]) -> Any:
    """One read by a fresh reader: the claim (or None), or the ClaimError it raised."""
    reader = DirectClaimGet.from_config(config(server, user), keepalive=60)
    assert reader is not None
    try:
        return await asyncio.to_thread(reader.get, "ns", "c")
    except ClaimError as exc:
        return exc
    finally:
        reader.close()


@pytest.mark.parametrize(("user", "direct"), [
    ({"token": "t"}, True),
    ({"tokenFile": "/var/run/secrets/kubernetes.io/serviceaccount/token"}, True),  # in-cluster
    ({"exec": {"apiVersion": "client.authentication.k8s.io/v1", "command": "aws"}}, False),
    ({"username": "u", "password": "p"}, False),
])
def test_which_users_are_read_directly(user: dict[str, Any], direct: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy", "ALL_PROXY", "all_proxy"):
        monkeypatch.delenv(name, raising=False)
    assert (DirectClaimGet.from_config(config("https://api:6443", user), keepalive=60) is not None) == direct
    monkeypatch.setenv("HTTPS_PROXY", "http://proxy:3128")
    assert DirectClaimGet.from_config(config("https://api:6443", user), keepalive=60) is None, \
        "with a proxy in the environment, lightkube (which honours it) reads the claims"


def test_a_rotated_token_file_is_read_again_after_a_401(tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text("first\n")
    accepted = {"Bearer first"}
    seen: list[str] = []

    async def handler(request: web.Request) -> web.Response:
        seen.append(request.headers.get("Authorization", ""))
        if seen[-1] not in accepted:
            return web.json_response({"kind": "Status", "code": 401, "message": "Unauthorized"}, status=401)
        return web.json_response(CLAIM)

    async def scenario() -> list[Any]:
        async with api(handler) as server:
            reader = DirectClaimGet.from_config(config(server, {"tokenFile": str(token)}), keepalive=60)
            assert reader is not None
            try:
                first = await asyncio.to_thread(reader.get, "ns", "c")
                token.write_text("second\n")  # the kubelet rotated the service-account token
                accepted.clear()
                accepted.add("Bearer second")
                second = await asyncio.to_thread(reader.get, "ns", "c")
                accepted.clear()  # now nothing is accepted: the 401 is an error, after one more try
                with pytest.raises(ClaimError, match="HTTP 401: Unauthorized"):
                    await asyncio.to_thread(reader.get, "ns", "c")
            finally:
                reader.close()
        return [first, second]

    claims = asyncio.run(scenario())
    assert all(c is not None and c.metadata is not None and c.metadata.uid == "u-1" for c in claims)
    assert seen == ["Bearer first", "Bearer first", "Bearer second", "Bearer second", "Bearer second"], \
        "the file is read once, then again only after a 401, with one retry per read"


@pytest.mark.parametrize(("status", "body", "expected"), [
    (404, {"kind": "Status", "code": 404, "message": "resourceclaims \"c\" not found"}, None),
    (403, {"kind": "Status", "code": 403, "message": "forbidden: node may not read it"},
     "reading the claim from the API server failed: HTTP 403: forbidden: node may not read it"),
    (500, "<html>bad gateway</html>", "reading the claim from the API server failed: HTTP 500: <html>bad gateway"),
    (200, {"metadata": {"uid": 7}}, "the API server sent a malformed claim: Expected `str | null`, got `int` - at "
     "`$.metadata.uid`"),
    (200, "x" * (MAX_BODY_BYTES + 10), f"longer than {MAX_BODY_BYTES} bytes"),
])
def test_answers_that_are_not_a_claim(status: int, body: Any, expected: str | None) -> None:
    async def handler(request: web.Request) -> web.Response:
        text = body if isinstance(body, str) else json.dumps(body)
        return web.Response(status=status, text=text, content_type="application/json")

    async def scenario() -> Any:
        async with api(handler) as server:
            return await read_once(server, {"token": "t"})

    got = asyncio.run(scenario())
    if expected is None:
        assert got is None, "404 means the claim does not exist"
    else:
        assert isinstance(got, ClaimError) and expected in str(got), got


def test_nothing_listening_is_a_claim_error_not_a_crash() -> None:
    got = asyncio.run(read_once("http://127.0.0.1:1", {"token": "t"}))
    assert isinstance(got, ClaimError), got
    assert str(got).startswith("reading the claim from the API server failed: ConnectionRefusedError")


def test_a_kept_connection_the_server_closed_is_retried_once_on_a_new_one() -> None:
    """An API server restart (or its idle timeout) closes a connection we keep: the next read must not fail."""
    connections = 0
    body = json.dumps(CLAIM).encode()

    async def serve_one_then_close(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal connections
        connections += 1
        await reader.readuntil(b"\r\n\r\n")
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s"
                     % (len(body), body))  # says nothing of closing, then closes: the client cannot know
        await writer.drain()
        writer.close()

    async def scenario() -> list[Any]:
        server = await asyncio.start_server(serve_one_then_close, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        reader = DirectClaimGet.from_config(config(f"http://127.0.0.1:{port}", {"token": "t"}), keepalive=60)
        assert reader is not None
        try:
            return [await asyncio.to_thread(reader.get, "ns", "c") for _ in range(3)]
        finally:
            reader.close()
            server.close()

    claims = asyncio.run(scenario())
    assert all(c is not None and c.metadata is not None and c.metadata.uid == "u-1" for c in claims)
    assert connections == 3, "each read after a closed connection opened a new one"


def test_a_token_file_that_would_split_the_header_is_a_claim_error(tmp_path: Path) -> None:
    """The token goes into an HTTP header: a file holding a line break (or other control bytes) must not inject
    a header or crash the reader; it fails the read with a clear error, and nothing reaches the server."""
    token = tmp_path / "token"
    token.write_text("good\r\nX-Injected: 1\n")
    seen: list[str] = []

    async def handler(request: web.Request) -> web.Response:
        seen.append(request.headers.get("X-Injected", ""))
        return web.json_response(CLAIM)

    async def scenario() -> Any:
        async with api(handler) as server:
            return await read_once(server, {"tokenFile": str(token)})

    got = asyncio.run(scenario())
    assert isinstance(got, ClaimError), got
    assert str(got).startswith("reading the claim from the API server failed: LocalProtocolError"), got
    assert seen == [], "no request was sent"
