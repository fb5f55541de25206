"""neuron-scheduler-extender's HTTP server over a real socket: the extender API verbs answer, hostile requests get
a 4xx with a reason, and the server keeps serving after each of them."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from prometheus_client import CollectorRegistry

from neuron_dra.extender.decide import Decider
from neuron_dra.extender.httpserver import HttpServer
from neuron_dra.extender.service import ExtenderService
from neuron_dra.usage_annotation import USAGE_ANNOTATION, DeviceUsage

NEURON = "aws.amazon.com/neuron"


async def _request(port: int, raw: bytes) -> tuple[int, bytes]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(raw)
    await writer.drain()
    data = await reader.read()
    writer.close()
    head, _, body = data.partition(b"\r\n\r\n")
    return int(head.split(b" ")[1]), body


def _post(path: str, body: bytes, extra: str = "") -> bytes:
    return (f"POST {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Length: {len(body)}\r\n{extra}\r\n"
            .encode() + body)


def _args() -> dict[str, Any]:
    pod = {"metadata": {"name": "p", "namespace": "ns", "uid": "u"},
           "spec": {"containers": [{"name": "c", "resources": {"limits": {NEURON: "4"}}}]}}
    free = DeviceUsage("torus4x4", 16, 4).to_json()
    return {"Pod": pod, "Nodes": {"items": [{"metadata": {"name": "a", "annotations": {USAGE_ANNOTATION: free}}}]}}


def test_verbs_and_hostile_requests() -> None:
    async def main() -> list[tuple[int, bytes]]:
        registry = CollectorRegistry()
        service = ExtenderService(Decider(), registry)
        server = HttpServer(service.handle, "127.0.0.1", 0, max_body=1 << 20)
        port = await server.start()
        good = json.dumps(_args()).encode()
        out = [
            await _request(port, _post("/filter", good)),
            await _request(port, _post("/prioritize", good)),
            await _request(port, _post("/filter", b"{not json")),
            await _request(port, _post("/filter", b"[" * 100000 + b"]" * 100000)),
            await _request(port, _post("/filter", b'{"Pod": 7, "Nodes": {"items": []}}')),
            await _request(port, b"POST /filter HTTP/1.1\r\nHost: x\r\nContent-Length: 99999999\r\n\r\n"),
            await _request(port, b"POST /filter HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"),
            await _request(port, b"POST /filter HTTP/1.1\r\nConnection: close\r\nContent-Length: 2\r\n\r\n{}"),
            await _request(port, b"GET /filter HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"),
            await _request(port, b"NONSENSE\r\n\r\n"),
            await _request(port, b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"),
            await _request(port, _post("/explain", good)),
        ]
        await server.close()
        counts = {(s.labels["verb"], s.labels["result"]): s.value for m in registry.collect() for s in m.samples
                  if s.name == "neuron_scheduler_extender_requests_total"}
        assert counts[("filter", "ok")] == 1 and counts[("filter", "bad_request")] == 3
        assert counts[("prioritize", "ok")] == 1
        return out

    (flt, pri, notjson, deep, badpod, huge, nolen, nohost, get, nonsense, health, explained) = asyncio.run(main())
    assert flt[0] == 200 and [n["metadata"]["name"] for n in json.loads(flt[1])["nodes"]["items"]] == ["a"]
    assert pri[0] == 200 and json.loads(pri[1])[0]["host"] == "a"
    assert notjson[0] == 400 and b"not JSON" in notjson[1]
    assert deep[0] == 400
    assert badpod[0] == 400 and b"pod must be a JSON object" in badpod[1]
    assert huge[0] == 413
    assert nolen[0] == 411
    assert nohost[0] == 400, "HTTP/1.1 without Host (RFC 9112 section 3.2)"
    assert get[0] == 405
    assert nonsense[0] == 400
    assert health == (200, b"ok\n")
    assert explained[0] == 200 and b"fits" in explained[1]
