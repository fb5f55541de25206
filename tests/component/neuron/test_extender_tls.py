"""neuron-scheduler-extender over mutual TLS on a real socket: a client with a certificate from the configured CA
is served; without one, with one from another CA, or over plain HTTP, the connection ends before any HTTP is
answered, so no filter reaches the extender. The CLI refuses half a TLS configuration with a one-line error."""

from __future__ import annotations

import asyncio
import json
import ssl
from pathlib import Path

import pytest
from accel_rig.certs import issue, make_ca
from prometheus_client import CollectorRegistry

from neuron_dra.extender.cli import main
from neuron_dra.extender.decide import Decider
from neuron_dra.extender.httpserver import HttpServer
from neuron_dra.extender.service import ExtenderService
from neuron_dra.extender.tls import TlsConfigError, server_context
from neuron_dra.usage_annotation import USAGE_ANNOTATION, DeviceUsage

NEURON = "aws.amazon.com/neuron"


def _pki(tmp: Path, name: str) -> dict[str, Path]:
    files = {k: tmp / f"{name}-{k}.pem" for k in ("ca", "ca-key", "server", "server-key", "client", "client-key")}
    make_ca(files["ca"], files["ca-key"], f"/CN={name}-ca", days=1)
    issue(files["ca"], files["ca-key"], files["server"], files["server-key"], "/CN=neuron-scheduler-extender",
          days=1, server_sans=["DNS:localhost", "IP:127.0.0.1"])
    issue(files["ca"], files["ca-key"], files["client"], files["client-key"], "/CN=my-scheduler", days=1)
    return files


def _filter_request() -> bytes:
    pod = {"metadata": {"name": "p", "namespace": "ns", "uid": "u-evil"},
           "spec": {"containers": [{"name": "c", "resources": {"limits": {NEURON: "16"}}}]}}
    free = DeviceUsage("torus4x4", 16, 4).to_json()
    body = json.dumps({"Pod": pod, "Nodes": {"items": [
        {"metadata": {"name": "trn2-a", "annotations": {USAGE_ANNOTATION: free}}}]}}).encode()
    return (f"POST /filter HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Length: {len(body)}\r\n\r\n"
            .encode() + body)


async def _exchange(port: int, ctx: ssl.SSLContext | None) -> bytes | str:
    """The raw answer, or the name of the error that ended the connection."""
    try:
        reader, writer = await asyncio.wait_for(
            asyncio.open_connection("127.0.0.1", port, ssl=ctx, server_hostname="localhost" if ctx else None), 10)
        writer.write(_filter_request())
        await writer.drain()
        data = await asyncio.wait_for(reader.read(), 10)
        writer.close()
        return data
    except (ssl.SSLError, ConnectionError) as exc:
        return type(exc).__name__


def _client_context(ca: Path, cert: Path | None = None, key: Path | None = None) -> ssl.SSLContext:
    ctx = ssl.create_default_context(cafile=ca)
    if cert is not None:
        ctx.load_cert_chain(cert, key)
    return ctx


def test_only_clients_with_a_certificate_from_the_ca_are_served(tmp_path: Path) -> None:
    ours, theirs = _pki(tmp_path, "ours"), _pki(tmp_path, "theirs")
    registry = CollectorRegistry()

    async def run() -> dict[str, bytes | str]:
        service = ExtenderService(Decider(), registry)
        server = HttpServer(service.handle, "127.0.0.1", 0,
                            ssl_context=server_context(ours["server"], ours["server-key"], ours["ca"]))
        port = await server.start()
        try:
            return {
                "with our client certificate": await _exchange(
                    port, _client_context(ours["ca"], ours["client"], ours["client-key"])),
                "without a client certificate": await _exchange(port, _client_context(ours["ca"])),
                "with another CA's client certificate": await _exchange(
                    port, _client_context(ours["ca"], theirs["client"], theirs["client-key"])),
                "over plain HTTP": await _exchange(port, None),
            }
        finally:
            await server.close()

    answers = asyncio.run(run())
    good = answers.pop("with our client certificate")
    assert isinstance(good, bytes) and good.startswith(b"HTTP/1.1 200"), good
    for who, answer in answers.items():
        assert not (isinstance(answer, bytes) and b"HTTP/1.1 2" in answer), f"{who}: {answer!r}"
    calls = sum(s.value for m in registry.collect() for s in m.samples
                if s.name == "neuron_scheduler_extender_requests_total")
    assert calls == 1, "only the client with our certificate reached the extender"


def test_server_context_names_the_unusable_file(tmp_path: Path) -> None:
    files = _pki(tmp_path, "ours")
    with pytest.raises(TlsConfigError, match="client CA file .*missing.pem"):
        server_context(files["server"], files["server-key"], tmp_path / "missing.pem")
    with pytest.raises(TlsConfigError, match="server certificate .*ours-client.pem"):
        server_context(files["client"], files["server-key"], files["ca"])  # key does not match the certificate


def test_cli_refuses_half_a_tls_configuration(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    files = _pki(tmp_path, "ours")
    assert main(["serve", "--tls-cert-file", str(files["server"]), "--tls-key-file", str(files["server-key"])]) == 2
    err = capsys.readouterr().err.strip()
    assert "--tls-client-ca-file" in err and len(err.splitlines()) == 1, err
