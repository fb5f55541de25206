"""The extender follows its TLS files as a Kubernetes Secret volume replaces them (new files in a new timestamped
directory, then an atomic rename of the ``..data`` symlink; the named files are symlinks through ``..data``):
under a steady stream of filter requests on new connections no request fails, connections made after the swap get
the new server certificate and the new client CA, and a client of a CA no longer listed is refused. Files that
cannot be used are one warning, and the previous ones stay in use. The server certificate's expiry is an ERROR
line at start when it has passed, a WARNING when little is left, and a metric."""

from __future__ import annotations

import asyncio
import logging
import os
import ssl
import time
from pathlib import Path

import pytest
from accel_rig.certs import issue, make_ca
from cryptography import x509
from cryptography.hazmat.primitives.serialization import Encoding
from prometheus_client import CollectorRegistry
from test_extender_tls import _filter_request, _pki

from neuron_dra.extender.decide import Decider
from neuron_dra.extender.httpserver import HttpServer
from neuron_dra.extender.service import ExtenderService
from neuron_dra.extender.tls import FollowedTls

DAY = 86400.0


class SecretVolume:
    """A directory laid out the way the kubelet writes a Secret volume, and its atomic update."""

    def __init__(self, root: Path) -> None:
        self.root = root
        root.mkdir()
        self.generation = 0

    def write(self, files: dict[str, bytes]) -> None:
        self.generation += 1
        data = self.root / f"..2026_12_06_00_00_{self.generation:02d}.000"
        data.mkdir()
        for name, content in files.items():
            (data / name).write_bytes(content)
        old = os.readlink(self.root / "..data") if (self.root / "..data").is_symlink() else None
        os.symlink(data.name, self.root / "..data_tmp")
        os.rename(self.root / "..data_tmp", self.root / "..data")  # the one atomic step
        for name in files:
            if not (self.root / name).is_symlink():
                os.symlink(f"..data/{name}", self.root / name)
        if old is not None:
            for f in (self.root / old).iterdir():
                f.unlink()
            (self.root / old).rmdir()

    def path(self, name: str) -> Path:
        return self.root / name


def _files(server: dict[str, Path], *cas: dict[str, Path]) -> dict[str, bytes]:
    return {"tls.crt": server["server"].read_bytes(), "tls.key": server["server-key"].read_bytes(),
            "ca.crt": b"".join(ca["ca"].read_bytes() for ca in cas)}


def _der(pem: Path) -> bytes:
    return x509.load_pem_x509_certificate(pem.read_bytes()).public_bytes(Encoding.DER)


def _client(trust: Path, client: dict[str, Path]) -> ssl.SSLContext:
    ctx = ssl.create_default_context(cafile=trust)
    ctx.load_cert_chain(client["client"], client["client-key"])
    return ctx


async def _call(port: int, ctx: ssl.SSLContext) -> tuple[str, bytes]:
    """('ok', the server certificate seen) for a 200 filter answer on a new connection, else (error, b'')."""
    try:
        reader, writer = await asyncio.wait_for(
            asyncio.open_connection("127.0.0.1", port, ssl=ctx, server_hostname="localhost"), 10)
        peer = writer.get_extra_info("ssl_object").getpeercert(binary_form=True)
        writer.write(_filter_request())
        await writer.drain()
        data = await asyncio.wait_for(reader.read(), 10)
        writer.close()
    except (ssl.SSLError, ConnectionError, TimeoutError) as exc:
        return type(exc).__name__, b""
    return ("ok", peer) if data.startswith(b"HTTP/1.1 200") else (data[:40].decode(errors="replace"), b"")


def _samples(registry: CollectorRegistry, name: str) -> dict[tuple[str, ...], float]:
    return {tuple(s.labels.values()): s.value for m in registry.collect() for s in m.samples if s.name == name}


def test_rotation_under_load_fails_no_filter(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    old, new = _pki(tmp_path, "old"), _pki(tmp_path, "new")
    both = tmp_path / "both-cas.pem"  # what my-scheduler trusts for the server during the rollover
    both.write_bytes(old["ca"].read_bytes() + new["ca"].read_bytes())
    volume = SecretVolume(tmp_path / "tls")
    volume.write(_files(old, old))
    registry = CollectorRegistry()
    tls = FollowedTls(volume.path("tls.crt"), volume.path("tls.key"), volume.path("ca.crt"), registry)

    async def run() -> dict[str, object]:
        service = ExtenderService(Decider(), CollectorRegistry())
        server = HttpServer(service.handle, "127.0.0.1", 0, ssl_context=tls.context)
        port = await server.start()
        stop, done = asyncio.Event(), asyncio.Event()
        follower = asyncio.create_task(tls.follow(stop, rescan=30.0))
        results: list[tuple[str, bytes]] = []
        load_client = {"ctx": _client(both, old)}

        async def load() -> None:
            while not done.is_set():
                results.append(await _call(port, load_client["ctx"]))

        async def served(der: bytes, client: ssl.SSLContext) -> bool:
            for _ in range(100):  # inotify and a 0.2 s debounce: well under a second; 10 s at most
                if (await _call(port, client))[1] == der:
                    return True
                await asyncio.sleep(0.1)
            return False

        workers = [asyncio.create_task(load()) for _ in range(6)]
        try:
            await asyncio.sleep(0.3)
            out: dict[str, object] = {}
            # a half-written state (the new certificate with the old key): one warning, the old pair stays in use
            volume.write({**_files(old, old), "tls.crt": new["server"].read_bytes()})
            await asyncio.sleep(0.8)
            out["after a bad write"] = await _call(port, _client(both, old))
            # step 1: a new server certificate from a new CA, both CAs accepted for clients
            volume.write(_files(new, old, new))
            out["new certificate served"] = await served(_der(new["server"]), _client(both, old))
            out["new CA's client during rollover"] = (await _call(port, _client(both, new)))[0]
            # step 2: the old CA goes; the load moves to the new client certificate, as my-scheduler would
            load_client["ctx"] = _client(both, new)
            await asyncio.sleep(0.3)
            volume.write(_files(new, new))
            for _ in range(100):
                if (await _call(port, _client(both, old)))[0] != "ok":
                    break
                await asyncio.sleep(0.1)
            await asyncio.sleep(0.3)
            out["old CA's client afterwards"] = (await _call(port, _client(both, old)))[0]
            out["new CA's client afterwards"] = (await _call(port, _client(both, new)))[0]
            out["without a client certificate"] = (await _call(port, ssl.create_default_context(cafile=both)))[0]
            return out
        finally:
            done.set()
            await asyncio.gather(*workers)
            out["load"] = list(results)
            stop.set()
            await follower
            await server.close()

    with caplog.at_level(logging.INFO, logger="neuron_dra.extender.tls"):
        out = asyncio.run(run())
    load = out.pop("load")
    assert isinstance(load, list)
    assert len(load) >= 30, f"too little load to prove anything: {len(load)}"
    failed = [r[0] for r in load if r[0] != "ok"]
    assert not failed, f"{len(failed)} of {len(load)} filters failed during the rotation: {failed[:5]}"
    assert {r[1] for r in load} == {_der(old["server"]), _der(new["server"])}, "load saw both certificates"
    assert out["after a bad write"] == ("ok", _der(old["server"]))
    assert out["new certificate served"] is True
    assert out["new CA's client during rollover"] == "ok"
    assert out["old CA's client afterwards"] != "ok"
    assert out["new CA's client afterwards"] == "ok"
    assert out["without a client certificate"] != "ok"
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING
                and "expires at" not in r.getMessage()]  # the 1-day test certificates are near their expiry
    assert len(warnings) == 1 and "cannot load the changed TLS files" in warnings[0], warnings
    assert all(r.exc_info is None for r in caplog.records), "no tracebacks"
    assert _samples(registry, "neuron_scheduler_extender_tls_reloads_total") == {("failed",): 1.0, ("ok",): 2.0}
    expiry = _samples(registry, "neuron_scheduler_extender_tls_certificate_expiry_timestamp_seconds")[()]
    assert expiry == x509.load_pem_x509_certificate(new["server"].read_bytes()).not_valid_after_utc.timestamp()


def _long_lived(tmp: Path, days: int) -> dict[str, Path]:
    files = {k: tmp / f"{days}-{k}.pem" for k in ("ca", "ca-key", "server", "server-key")}
    make_ca(files["ca"], files["ca-key"], "/CN=ca", days=days)
    issue(files["ca"], files["ca-key"], files["server"], files["server-key"], "/CN=s", days=days,
          server_sans=["DNS:localhost"])
    return files


@pytest.mark.parametrize(("days", "later", "level", "words"), [
    (400, 0, None, ""),  # a fresh 400-day certificate: nothing to say
    (400, 300, logging.WARNING, "expires at"),  # 100 days left: under a third of its lifetime
    (3650, 3630, logging.WARNING, "expires at"),  # 20 days left: under 30 days
    (1, 2, logging.ERROR, "expired at"),  # already expired when the extender starts
])
def test_expiry_is_one_line_at_start(tmp_path: Path, caplog: pytest.LogCaptureFixture, days: int, later: int,
                                     level: int | None, words: str) -> None:
    files = _long_lived(tmp_path, days)
    start = time.time() + later * DAY
    clock = {"now": start}
    tls = FollowedTls(files["server"], files["server-key"], files["ca"], clock=lambda: clock["now"])
    stop = asyncio.Event()
    stop.set()
    with caplog.at_level(logging.INFO, logger="neuron_dra.extender.tls"):
        asyncio.run(tls.follow(stop))  # start: the expiry check, then stop at once
    lines = [r for r in caplog.records if r.levelno >= logging.WARNING]
    if level is None:
        assert lines == []
        return
    assert [r.levelno for r in lines] == [level] and words in lines[0].getMessage()
    assert str(files["server"]) in lines[0].getMessage() and lines[0].exc_info is None
    assert tls.check_expiry() is None, "not again the same day"
    clock["now"] = start + DAY + 1
    assert tls.check_expiry() is not None, "again a day later"
