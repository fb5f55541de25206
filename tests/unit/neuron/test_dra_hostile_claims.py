"""Hand-made DRA requests with hostile claim references and allocations (issue 14, items 2 and 3).

The kubelet is not the only thing that can reach the DRA socket. A namespace, name or UID that is not a Kubernetes
name must fail that claim alone, before any API request, and before anything is recorded; and whatever is in the
checkpoint, an unprepare must be able to clear it so no device stays reserved for ever.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from drarig import DriverRig, host_paths
from drarig import claim as api_claim
from hostcache import copy_host
from lightkube import Client, KubeConfig

from accel_core.dra.checkpoint import Checkpoint, CheckpointFile, read_boot_id
from accel_core.dra.claimget import DirectClaimGet
from accel_core.dra.claims import ClaimGet, ClaimReader, LightkubeClaimGet
from accel_core.dra.cleanup import StaleClaimCleaner
from accel_core.dra.metrics import DriverMetrics
from accel_core.dra.pluginserver import DraPlugin
from accel_core.dra.types import ClaimError, ClaimRef
from neuron_dra.dra.profile import NeuronProfile

NODE = "node-a"
DRIVER = "neuron.aws.com"


def claim(ns: str, name: str, uid: str, devices: list[int]) -> dict[str, Any]:
    return api_claim(name, [f"neuron-device-{i}" for i in devices], driver=DRIVER, uid=uid, namespace=ns)


class Rig(DriverRig):
    def __init__(self, root: Path) -> None:
        copy_host(root / "host", "inf2.48xlarge")
        super().__init__(host_paths(root, root / "host"), NeuronProfile())


@pytest.fixture
def rig(tmp_path: Path) -> Rig:
    return Rig(tmp_path)


HOSTILE = [
    (ClaimRef("../../../api/v1/nodes", "u-1", "x"), "namespace '../../../api/v1/nodes' is not a DNS-1123 label"),
    (ClaimRef("ns", "u-1", "c/../../../../api/v1/secrets"), "claim name 'c/../../../../api/v1/secrets' is not"),
    (ClaimRef("ns", "u-1", "C"), "claim name 'C' is not a DNS-1123 subdomain"),
    (ClaimRef("ns", "u-1", "x" * 254), "claim name 'xxxxxxxxxxxxxxxx"),
    (ClaimRef("NS", "u-1", "c"), "namespace 'NS' is not"),
    (ClaimRef("ns", "bad\x00uid", "c"), "claim UID 'bad\\x00uid' is not a UID"),
    (ClaimRef("ns", "u" * 300, "c"), "claim UID 'uuuu"),
    (ClaimRef("ns", "", "c"), "claim UID '' is not a UID"),
    (ClaimRef("ns", "../x", "c"), "claim UID '../x' is not a UID"),
]


@pytest.mark.parametrize(("ref", "message"), HOSTILE)
def test_a_hostile_reference_fails_alone_before_any_read_or_record(rig: Rig, ref: ClaimRef, message: str) -> None:
    rig.claims.claims[("ns", "good")] = claim("ns", "good", "u-good", [0])
    rig.claims.claims[(ref.namespace, ref.name)] = claim(ref.namespace, ref.name, ref.uid, [1])
    out = rig.answer(ref, ClaimRef("ns", "u-good", "good"))
    devices, error = out[ref.uid]
    assert devices == [] and "invalid claim reference: " + message in error
    assert len(error) < 400, "messages stay short whatever the input"
    assert out["u-good"][1] == "" and [d.device for d in out["u-good"][0]] == ["neuron-device-0"]
    assert rig.claims.asked == [("ns", "good")], "the hostile claim was never read"
    assert [c.uid for c in rig.store.claims()] == ["u-good"]
    assert sorted(p.name for p in rig.paths.cdi_root.iterdir()) == ["k8s.neuron.aws.com-claim_u-good.json"]
    # the device the hostile claim named is free for a real claim
    rig.claims.claims[("ns", "next")] = claim("ns", "next", "u-next", [1])
    assert rig.answer(ClaimRef("ns", "u-next", "next"))["u-next"][1] == ""


def test_the_api_reader_refuses_unchecked_names_without_a_request() -> None:
    # an API server address where nothing listens: a request would fail with a transport error instead
    config = KubeConfig.from_dict({
        "clusters": [{"name": "c", "cluster": {"server": "https://127.0.0.1:1"}}],
        "users": [{"name": "u", "user": {"token": "t"}}],
        "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}], "current-context": "x"})

    def read(namespace: str, name: str) -> str:
        get = LightkubeClaimGet(Client(config))
        try:
            ClaimReader(get).read(namespace, name)
        except ClaimError as exc:
            return str(exc)
        finally:
            get.close()
        return "no error"

    assert read("..", "nodes") == "invalid claim reference: namespace '..' is not a DNS-1123 label"
    assert "transport" not in read("ns", "../../nodes")
    assert "reading the claim from the API server failed" in read("ns", "fine")


@pytest.mark.parametrize(("result", "message"), [
    ({"request": "r/../../x", "device": "neuron-device-0"}, "request name 'r/../../x' is not a DNS label"),
    ({"request": "r", "device": "../../../etc/passwd"}, "device name '../../../etc/passwd' is not a DNS label"),
    ({"request": "r", "device": "neuron-device-0\n"}, "device name 'neuron-device-0\\n' is not a DNS label"),
])
def test_hostile_allocation_results_record_nothing(rig: Rig, result: dict[str, Any], message: str) -> None:
    data = claim("ns", "c", "u-1", [])
    data["status"]["allocation"]["devices"]["results"] = [{"driver": DRIVER, "pool": NODE, **result}]
    rig.claims.claims[("ns", "c")] = data
    _, error = rig.answer(ClaimRef("ns", "u-1", "c"))["u-1"]
    assert message in error
    assert rig.store.claims() == [] and not rig.paths.cdi_root.exists()


@contextlib.contextmanager
def api_server_sending(body: bytes) -> Iterator[KubeConfig]:
    """Plain HTTP that answers every request with ``body``: a stand-in for an API server (or something in front
    of it) sending a claim of the wrong shape, which a real API server cannot store."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 (the http.server hook name)
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    # a short poll: shutdown() waits for serve_forever's next poll (0.5 s by default, per test)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True)
    thread.start()
    try:
        yield KubeConfig.from_dict({
            "clusters": [{"name": "c", "cluster": {"server": f"http://127.0.0.1:{server.server_address[1]}"}}],
            "users": [{"name": "u", "user": {"token": "t"}}],
            "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}], "current-context": "x"})
    finally:
        server.shutdown()
        server.server_close()


def allocation(devices: dict[str, Any]) -> bytes:
    return json.dumps({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
                       "metadata": {"namespace": "ns", "name": "c", "uid": "u-1"},
                       "status": {"allocation": {"devices": devices}}}).encode()


GOOD = {"request": "r", "driver": DRIVER, "pool": NODE, "device": "neuron-device-0"}
MALFORMED = [  # the path is where the ResourceClaim schema (resource.k8s.io/v1) puts the broken field
    (allocation({"results": "not a list"}), "$.status.allocation.devices.results"),
    (allocation({"results": [{**GOOD, "request": 7}]}), "$.status.allocation.devices.results[0].request"),
    (allocation({"results": [{k: v for k, v in GOOD.items() if k != "device"}]}), "field `device`"),
    (allocation({"results": [GOOD], "config": [{"source": "FromClaim", "opaque": {
        "driver": DRIVER, "parameters": "{}"}}]}), "$.status.allocation.devices.config[0].opaque.parameters"),
    (b'{"metadata": {"uid": "u-1"}, "status": {"allocation": {', ""),  # cut off: not JSON
]


@pytest.mark.parametrize("direct", [False, True], ids=["lightkube", "direct-get"])
@pytest.mark.parametrize(("body", "where"), MALFORMED)
def test_a_malformed_claim_from_the_api_server_is_a_claim_error(rig: Rig, body: bytes, where: str,
                                                                 direct: bool) -> None:
    def prepare(config: KubeConfig) -> dict[str, tuple[list[Any], str]]:
        single = config.get()
        assert single is not None
        get: ClaimGet | None = DirectClaimGet.from_config(single, keepalive=60) if direct else LightkubeClaimGet(
            Client(config))
        assert get is not None
        try:
            return DraPlugin(rig.driver, rig.paths, claims=ClaimReader(get)).prepare_claims_blocking(
                [ClaimRef("ns", "u-1", "c")])
        finally:
            get.close()

    with api_server_sending(body) as config:
        devices, error = prepare(config)["u-1"]
    assert devices == [] and "the API server sent a malformed claim" in error and where in error
    assert "ns/c" in error and "internal error" not in error
    assert rig.store.claims() == [] and not rig.paths.cdi_root.exists()


def poison(rig: Rig, uid: str, name: str, device: int) -> None:
    """A checkpoint entry as an older driver could have left it: recorded before its names were checked."""
    entry = {"state": "PrepareStarted", "namespace": "ns", "name": name, "pool": NODE,
             "requests": [{"name": "r", "devices": [f"neuron-device-{device}"], "deviceEdits": {}, "edits": {}}]}
    CheckpointFile(rig.checkpoint).save(Checkpoint(read_boot_id(rig.paths.host_root), {uid: entry}))
    rig.restart()


@pytest.mark.parametrize("uid", ["bad\x00uid", "u" * 300, "../../etc"])
def test_unprepare_always_clears_an_entry_and_frees_its_devices(rig: Rig, uid: str) -> None:
    poison(rig, uid, "c", 2)
    rig.claims.claims[("ns", "other")] = claim("ns", "other", "u-other", [2])
    assert "already prepared" in rig.answer(ClaimRef("ns", "u-other", "other"))["u-other"][1]
    assert rig.unanswer(ClaimRef("ns", uid, "c"))[uid][1] == ""
    assert rig.store.claims() == []
    assert CheckpointFile(rig.checkpoint).load().claims == {}
    assert rig.answer(ClaimRef("ns", "u-other", "other"))["u-other"][1] == ""


def test_cleanup_clears_entries_no_api_object_can_match(rig: Rig) -> None:
    poison(rig, "u-1", "../../nodes/x", 3)

    async def clean() -> list[tuple[str, str]]:
        cleaner = StaleClaimCleaner(store=rig.store, reader=rig.reader, unprepare=rig.plugin.unprepare_claims,
                                    driver=DRIVER, pool=NODE, metrics=DriverMetrics(None, "neuron_dra"))
        return [(c.ref.uid, c.staleness.reason) for c in await cleaner.clean_once()]

    assert asyncio.run(clean()) == [("u-1", "invalid")]
    assert rig.claims.asked == [] and rig.store.claims() == []
