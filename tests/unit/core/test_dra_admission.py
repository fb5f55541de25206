"""The admission webhook's review of ResourceClaims and ResourceClaimTemplates, with the drivers' real decoders, and
the ``webhook`` subcommand's HTTPS server.

Expected refusals come from the drivers' documented config rules (neuron_dra/dra/config.py, efa_plugin/dra/config.py:
``logicalNeuronCore`` is 1 or 2, ``ultraserverMode`` 1, 2 or 4, unknown fields refused, EfaConfig has no settings)
and from the place prepare names a config by (``config[<index>] (FromClaim, requests <names>)``)."""

from __future__ import annotations

import asyncio
import json
import ssl
import subprocess
import sys
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from accel_rig.certs import issue, make_ca

from accel_core.dra.admission import BadReview, review
from accel_core.dra.webhookserver import WebhookServer, server_context
from efa_plugin.dra.profile import EfaProfile
from neuron_dra.dra.profile import NeuronProfile

NEURON = NeuronProfile()
EFA = EfaProfile()


def neuron_params(**fields: Any) -> dict[str, Any]:
    return {"apiVersion": "neuron.aws.com/v1", "kind": "NeuronConfig", **fields}


def claim_spec(*configs: dict[str, Any]) -> dict[str, Any]:
    return {"devices": {"requests": [{"name": "neuron", "exactly": {"deviceClassName": "neuron.aws.com"}}],
                        "config": list(configs)}}


def opaque(driver: str, parameters: Any, requests: list[str] | None = None) -> dict[str, Any]:
    entry: dict[str, Any] = {"opaque": {"driver": driver, "parameters": parameters}}
    if requests is not None:
        entry["requests"] = requests
    return entry


def admission(kind: str, spec: dict[str, Any], *, operation: str = "CREATE") -> bytes:
    obj = {"apiVersion": "resource.k8s.io/v1", "kind": kind, "metadata": {"name": "x", "namespace": "ns"},
           "spec": {"spec": spec} if kind == "ResourceClaimTemplate" else spec}
    return json.dumps({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {
        "uid": "705ab4f5-6393-11e8-b7cc-42010a800002",
        "kind": {"group": "resource.k8s.io", "version": "v1", "kind": kind},
        "resource": {"group": "resource.k8s.io", "version": "v1", "resource": kind.lower() + "s"},
        "namespace": "ns", "name": "x", "operation": operation, "object": obj}}).encode()


def neuron_review(kind: str, *configs: dict[str, Any]) -> dict[str, Any]:
    answer = review(admission(kind, claim_spec(*configs)), driver="neuron.aws.com", decode=NEURON.decode_config)
    assert answer["apiVersion"] == "admission.k8s.io/v1" and answer["kind"] == "AdmissionReview"
    assert answer["response"]["uid"] == "705ab4f5-6393-11e8-b7cc-42010a800002"
    return dict(answer["response"])


@pytest.mark.parametrize("kind", ["ResourceClaimTemplate", "ResourceClaim"])
def test_lnc_3_is_refused_with_the_drivers_line(kind: str) -> None:
    got = neuron_review(kind, opaque("neuron.aws.com", neuron_params(logicalNeuronCore=3), ["neuron"]))
    assert got["allowed"] is False
    assert got["status"]["code"] == 422
    assert got["status"]["message"] == \
        "config[0] (FromClaim, requests neuron): logicalNeuronCore must be 1 or 2, got 3"


@pytest.mark.parametrize("lnc", [1, 2])
def test_lnc_1_and_2_are_allowed(lnc: int) -> None:
    got = neuron_review("ResourceClaimTemplate", opaque("neuron.aws.com", neuron_params(logicalNeuronCore=lnc)))
    assert got == {"uid": "705ab4f5-6393-11e8-b7cc-42010a800002", "allowed": True}


def test_a_misspelt_field_is_refused_naming_it() -> None:
    got = neuron_review("ResourceClaimTemplate",
                        opaque("neuron.aws.com", neuron_params(logicalNeuronCores=2)))
    assert got["allowed"] is False
    message = got["status"]["message"]
    assert message.startswith("config[0] (FromClaim): strict decoding error: unknown field 'logicalNeuronCores'")


def test_the_index_is_the_configs_place_in_the_spec_and_other_drivers_configs_are_theirs() -> None:
    got = neuron_review("ResourceClaim",
                        opaque("gpu.example.com", {"anything": True}),
                        opaque("neuron.aws.com", {"apiVersion": "neuron.aws.com/v1", "kind": "UltraServerConfig",
                                                  "ultraserverMode": 4}),
                        opaque("neuron.aws.com", neuron_params(logicalNeuronCore=2), ["a", "b"]),
                        opaque("neuron.aws.com", {"apiVersion": "neuron.aws.com/v1", "kind": "UltraServerConfig",
                                                  "ultraserverMode": 3}, ["b"]))
    assert got["allowed"] is False
    assert got["status"]["message"].startswith(
        "config[3] (FromClaim, requests b): ultraserverMode must be one of 1, 2, 4")


def test_a_config_naming_no_request_of_the_claim_is_still_checked_as_prepare_does() -> None:
    got = neuron_review("ResourceClaim", opaque("neuron.aws.com", neuron_params(logicalNeuronCore=0), ["nope"]))
    assert got["allowed"] is False and "logicalNeuronCore must be 1 or 2, got 0" in got["status"]["message"]


@pytest.mark.parametrize("parameters, part", [
    ('{"apiVersion": "neuron.aws.com/v1", "kind": "NeuronConfig"}', "parameters must be an object, got a string"),
    ({"apiVersion": "neuron.aws.com/v2", "kind": "NeuronConfig"}, "apiVersion 'neuron.aws.com/v2' is not supported"),
    ({"apiVersion": "neuron.aws.com/v1", "kind": "GpuConfig"}, "kind 'GpuConfig' is not supported"),
    ({"apiVersion": "neuron.aws.com/v1", "kind": "NeuronConfig", "logicalNeuronCore": "2"},
     "logicalNeuronCore must be 1 or 2, got '2'"),
])
def test_what_prepare_refuses_admission_refuses(parameters: Any, part: str) -> None:
    got = neuron_review("ResourceClaimTemplate", opaque("neuron.aws.com", parameters))
    assert got["allowed"] is False and part in got["status"]["message"], got


def test_efa_unknown_field_refused_and_bare_config_allowed() -> None:
    def efa(parameters: Any) -> dict[str, Any]:
        body = admission("ResourceClaimTemplate", claim_spec(opaque("efa.aws.com", parameters)))
        return dict(review(body, driver="efa.aws.com", decode=EFA.decode_config)["response"])

    bad = efa({"apiVersion": "efa.aws.com/v1", "kind": "EfaConfig", "mtu": 9001})
    assert bad["allowed"] is False
    assert bad["status"]["message"].startswith("config[0] (FromClaim): strict decoding error: unknown field 'mtu'")
    assert efa({"apiVersion": "efa.aws.com/v1", "kind": "EfaConfig"})["allowed"] is True
    # a Neuron config in the same claim is not the EFA webhook's to refuse
    body = admission("ResourceClaim", claim_spec(opaque("neuron.aws.com", neuron_params(logicalNeuronCore=3))))
    assert review(body, driver="efa.aws.com", decode=EFA.decode_config)["response"]["allowed"] is True


def test_claims_without_configs_deletes_and_other_kinds_are_allowed() -> None:
    assert neuron_review("ResourceClaim")["allowed"] is True
    bad = opaque("neuron.aws.com", neuron_params(logicalNeuronCore=3))
    body = admission("ResourceClaim", claim_spec(bad), operation="DELETE")
    assert review(body, driver="neuron.aws.com", decode=NEURON.decode_config)["response"]["allowed"] is True
    body = admission("Pod", claim_spec(bad))
    assert review(body, driver="neuron.aws.com", decode=NEURON.decode_config)["response"]["allowed"] is True


def test_a_device_class_config_is_checked_and_named_as_prepare_names_a_class_config() -> None:
    spec = {"selectors": [{"cel": {"expression": "device.driver == 'neuron.aws.com'"}}],
            "config": [opaque("neuron.aws.com", neuron_params(logicalNeuronCore=1)),
                       opaque("neuron.aws.com", neuron_params(logicalNeuronCore=4))]}
    answer = review(admission("DeviceClass", spec), driver="neuron.aws.com", decode=NEURON.decode_config)
    assert answer["response"]["allowed"] is False
    assert answer["response"]["status"]["message"] == "config[1] (FromClass): logicalNeuronCore must be 1 or 2, got 4"
    spec["config"] = spec["config"][:1]
    answer = review(admission("DeviceClass", spec), driver="neuron.aws.com", decode=NEURON.decode_config)
    assert answer["response"]["allowed"] is True


@pytest.mark.parametrize("body, part", [
    (b"not json", "body is not JSON"),
    (b"[]", "not an AdmissionReview"),
    (b'{"kind": "AdmissionReview"}', "not an AdmissionReview"),
    (b'{"kind": "AdmissionReview", "request": {"uid": ""}}', "no uid"),
])
def test_a_body_that_is_no_review_is_a_bad_review(body: bytes, part: str) -> None:
    with pytest.raises(BadReview, match=part):
        review(body, driver="neuron.aws.com", decode=NEURON.decode_config)


def test_shapes_that_are_not_claims_are_allowed_not_crashing() -> None:
    for spec in ({"devices": None}, {"devices": {"config": "x"}}, {"devices": {"config": [1, None, {"opaque": 3}]}}):
        body = admission("ResourceClaim", spec)
        assert review(body, driver="neuron.aws.com", decode=NEURON.decode_config)["response"]["allowed"] is True


@pytest.fixture(scope="module")
def tls_files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("webhook-tls")
    files = {name: d / name for name in ("ca.crt", "ca.key", "tls.crt", "tls.key")}
    make_ca(files["ca.crt"], files["ca.key"], "/CN=test-webhook-ca", days=2)
    issue(files["ca.crt"], files["ca.key"], files["tls.crt"], files["tls.key"], "/CN=webhook", days=1,
          server_sans=["IP:127.0.0.1"])
    return files


def test_the_https_server_answers_reviews_and_bad_bodies(tls_files: dict[str, Path]) -> None:
    async def run() -> None:
        server = WebhookServer("neuron.aws.com", NEURON.decode_config, "127.0.0.1", 0,
                               server_context(tls_files["tls.crt"], tls_files["tls.key"]))
        port = await server.start()
        client_ctx = ssl.create_default_context(cafile=str(tls_files["ca.crt"]))
        try:
            async with aiohttp.ClientSession() as session:
                url = f"https://127.0.0.1:{port}"
                bad = admission("ResourceClaimTemplate",
                                claim_spec(opaque("neuron.aws.com", neuron_params(logicalNeuronCore=3))))
                async with session.post(f"{url}/validate", data=bad, ssl=client_ctx,
                                        headers={"Content-Type": "application/json"}) as resp:
                    assert resp.status == 200
                    answer = await resp.json()
                assert answer["response"]["allowed"] is False
                assert answer["response"]["status"]["message"].endswith("logicalNeuronCore must be 1 or 2, got 3")
                big = admission("ResourceClaim", {**claim_spec(), "pad": "x" * (200 << 10)})  # reviewed in a thread
                async with session.post(f"{url}/validate", data=big, ssl=client_ctx) as resp:
                    assert resp.status == 200 and (await resp.json())["response"]["allowed"] is True
                async with session.post(f"{url}/validate", data=b"{}", ssl=client_ctx) as resp:
                    assert resp.status == 400
                async with session.get(f"{url}/healthz", ssl=client_ctx) as resp:
                    assert resp.status == 200
                with pytest.raises(aiohttp.ClientError):  # TLS only: plain HTTP gets no answer
                    async with session.get(f"http://127.0.0.1:{port}/healthz"):
                        pass
        finally:
            await server.close()

    asyncio.run(run())


@pytest.mark.parametrize("script, flags, part", [
    ("neuron_dra.dra.cli", [], "--tls-cert-file and --tls-key-file required"),
    ("efa_plugin.dra.cli", ["--tls-cert-file", "/nonexistent/tls.crt", "--tls-key-file", "/nonexistent/tls.key"],
     "argument --tls-cert-file: expected a PEM file, got '/nonexistent/tls.crt' (no such file)"),
    ("efa_plugin.dra.cli", ["--tls-cert-file", "/etc/hostname", "--tls-key-file", "/etc/hostname"],
     "cannot use certificate /etc/hostname with key /etc/hostname"),
])
def test_the_webhook_subcommand_refuses_without_usable_tls(script: str, flags: list[str], part: str) -> None:
    proc = subprocess.run([sys.executable, "-m", script, "webhook", *flags], capture_output=True, text=True,
                          timeout=60, env={"PATH": "/usr/bin:/bin"}, check=False)
    assert proc.returncode == 2, proc.stderr
    last = proc.stderr.strip().splitlines()[-1]  # a bad flag gets argparse's usage lines before it
    assert part in last and last.startswith(f"{script.split('.')[0].split('_')[0]}-dra-driver webhook: error: "), \
        proc.stderr
