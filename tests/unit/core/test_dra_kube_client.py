"""The DRA driver's API clients (``accel_core.dra.cli.kube_client`` and the claim GET of the prepare path,
``accel_core.dra.claimget``): TLS and client certificate from the kubeconfig, one kept-alive connection for claim
reads that come more than httpx's default 5 s apart, and bearer tokens from a file that is re-read after a 401."""

from __future__ import annotations

import asyncio
import json
import ssl
from pathlib import Path

import pytest
from accel_rig.controlplane_pki import ADMIN_USER, cert_user, generate_pki, write_kubeconfig
from lightkube.resources.resource_v1 import ResourceClaim

from accel_core.dra.claimget import DirectClaimGet
from accel_core.dra.cli import API_KEEPALIVE_SECONDS, kube_client, kube_config

CLAIM = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
         "metadata": {"name": "c", "namespace": "ns", "uid": "u-1"}, "spec": {"devices": {}}}


class TlsApi:
    """A bare HTTPS/1.1 server that needs a client certificate from the CA; answers every GET with one claim and
    keeps the connection open, counting connections."""

    def __init__(self, cert: Path, key: Path, ca: Path) -> None:
        self.ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH, cafile=str(ca))
        self.ctx.load_cert_chain(str(cert), str(key))
        self.ctx.verify_mode = ssl.CERT_REQUIRED
        self.connections = 0
        self.peers: list[str] = []
        self.server: asyncio.Server | None = None

    async def start(self) -> int:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0, ssl=self.ctx)
        port: int = self.server.sockets[0].getsockname()[1]
        return port

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        cert = writer.get_extra_info("peercert") or {}
        self.peers.append(dict(x[0] for x in cert.get("subject", ())).get("commonName", ""))
        body = json.dumps(CLAIM).encode()
        try:
            while await reader.readuntil(b"\r\n\r\n"):
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                             b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError, asyncio.CancelledError):
            pass  # the client closed, or the test is over
        finally:
            writer.close()


def test_claim_reads_reuse_one_connection_across_idle_gaps(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy", "ALL_PROXY", "all_proxy"):
        monkeypatch.delenv(name, raising=False)
    pki = generate_pki(tmp_path / "pki")
    api = TlsApi(pki.apiserver_cert, pki.apiserver_key, pki.ca_cert)

    async def scenario() -> None:
        port = await api.start()
        kubeconfig = write_kubeconfig(tmp_path / "kubeconfig", f"https://127.0.0.1:{port}", pki.ca_cert, "admin",
                                      cert_user(*pki.client("admin")))
        config = kube_config(str(kubeconfig))
        client = kube_client(config, "test")
        direct = DirectClaimGet.from_config(config, keepalive=API_KEEPALIVE_SECONDS)
        assert direct is not None, "a client-certificate user is read directly"
        try:
            first = [await client.get(ResourceClaim, "c", namespace="ns"),
                     await asyncio.to_thread(direct.get, "ns", "c")]
            await asyncio.sleep(6)  # longer than the HTTP client's default keep-alive of 5 s
            second = [await client.get(ResourceClaim, "c", namespace="ns"),
                      await asyncio.to_thread(direct.get, "ns", "c")]
        finally:
            await client.close()
            direct.close()
            assert api.server is not None
            api.server.close()
        for claim in first + second:
            assert claim is not None and claim.metadata is not None and claim.metadata.uid == "u-1"

    asyncio.run(scenario())
    assert api.connections == 2, "each client's second read reused its first connection"
    assert api.peers == [ADMIN_USER, ADMIN_USER], "the client certificate of the kubeconfig was presented"
