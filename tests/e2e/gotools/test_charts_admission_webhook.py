"""The charts' admission webhook objects (draDriver.admissionWebhook): off by default; when on, a TLS Secret, a
Deployment running ``<driver> webhook``, a Service and a ValidatingWebhookConfiguration that fit together (the
Service selects the pods and reaches their HTTPS port, the configuration names the Service and trusts the CA that
signed the Service's certificate for its in-cluster DNS name). The configuration's CEL is exercised against the real
API server in tests/e2e/test_dra_admission_webhook_e2e.py."""

from __future__ import annotations

import base64
from pathlib import Path
from typing import Any

import pytest
from chart_render import EFA_CHART, NEURON_CHART, Rendered, RenderError, container, env_of, template
from cryptography import x509
from cryptography.hazmat.primitives.asymmetric import padding, rsa

DRA_ON = ("--set", "devicePlugin.enabled=false", "--set", "draDriver.enabled=true")
HOOK_ON = (*DRA_ON, "--set", "draDriver.admissionWebhook.enabled=true")
KINDS = ("Secret", "Deployment", "Service", "ValidatingWebhookConfiguration")

#: chart, driver, console script, object name, namespace (the seed's DRA namespace for Neuron; EFA's kube-system)
CHARTS = [
    (NEURON_CHART, "neuron.aws.com", "neuron-dra-driver", "neuron-dra-driver-admission-webhook", "neuron-dra-driver"),
    (EFA_CHART, "efa.aws.com", "efa-dra-driver", "aws-efa-k8s-device-plugin-dra-driver-admission-webhook",
     "kube-system"),
]


pytestmark = pytest.mark.gotools  # helm, built from Go (the shared fixture in tests/e2e/conftest.py)


def webhook_objects(r: Rendered, name: str) -> dict[str, dict[str, Any]]:
    return {kind: r.get(kind, name if kind != "Secret" else f"{name}-tls") for kind in KINDS}


@pytest.mark.parametrize("chart", [NEURON_CHART, EFA_CHART], ids=["neuron", "efa"])
def test_off_by_default(helm: Path, chart: Path) -> None:
    r = template(helm, chart, *DRA_ON)
    assert not r.all("ValidatingWebhookConfiguration")
    assert not [d for d in r if "admission-webhook" in d["metadata"]["name"]]


@pytest.mark.parametrize("chart, driver, command, name, namespace", CHARTS, ids=["neuron", "efa"])
def test_the_objects_fit_together(helm: Path, chart: Path, driver: str, command: str, name: str,
                                  namespace: str) -> None:
    r = template(helm, chart, *HOOK_ON, "--namespace", "neuron-dra-driver" if driver == "neuron.aws.com" else "x")
    objs = webhook_objects(r, name)
    secret, deploy, service, vwc = (objs[k] for k in KINDS)
    for obj in (secret, deploy, service):
        assert obj["metadata"]["namespace"] == namespace

    # the Deployment runs `<command> webhook` with the Secret's files, as nobody, talking to nothing
    pod = deploy["spec"]["template"]
    c = container(deploy)
    assert c["command"] == [command, "webhook"]
    env = env_of(c)
    mount = next(m for m in c["volumeMounts"] if m["name"] == "tls")
    assert env["TLS_CERT_FILE"] == f"{mount['mountPath']}/tls.crt"
    assert env["TLS_KEY_FILE"] == f"{mount['mountPath']}/tls.key"
    assert pod["spec"]["volumes"] == [{"name": "tls", "secret": {"secretName": f"{name}-tls"}}]
    assert pod["spec"]["automountServiceAccountToken"] is False
    assert pod["spec"]["securityContext"]["runAsNonRoot"] is True
    (port,) = c["ports"]
    assert int(env["WEBHOOK_PORT"]) == port["containerPort"] == 8443
    assert c["readinessProbe"]["httpGet"]["scheme"] == "HTTPS"

    # the Service selects those pods and reaches their HTTPS port
    labels = pod["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= labels.items()
    assert deploy["spec"]["selector"]["matchLabels"] == service["spec"]["selector"]
    (svc_port,) = service["spec"]["ports"]
    assert svc_port["targetPort"] == port["name"] and svc_port["port"] == 443

    # the configuration calls that Service and trusts the CA that signed its certificate for its DNS name
    (hook,) = vwc["webhooks"]
    assert hook["name"] == f"opaque-configs.{driver}"
    assert hook["clientConfig"]["service"] == {"name": name, "namespace": namespace, "path": "/validate", "port": 443}
    assert hook["clientConfig"]["caBundle"] == secret["data"]["ca.crt"]
    ca = x509.load_pem_x509_certificate(base64.b64decode(secret["data"]["ca.crt"]))
    cert = x509.load_pem_x509_certificate(base64.b64decode(secret["data"]["tls.crt"]))
    sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value.get_values_for_type(x509.DNSName)
    assert f"{name}.{namespace}.svc" in sans
    public = ca.public_key()
    assert isinstance(public, rsa.RSAPublicKey) and cert.signature_hash_algorithm is not None
    public.verify(cert.signature, cert.tbs_certificate_bytes, padding.PKCS1v15(), cert.signature_hash_algorithm)
    assert pod["metadata"]["annotations"]["checksum/tls"]  # a renewed certificate rolls the pods

    # what is sent: claims, templates and classes, CREATE and UPDATE, only those carrying this driver's configs
    assert hook["rules"] == [{"apiGroups": ["resource.k8s.io"], "apiVersions": ["v1"],
                              "operations": ["CREATE", "UPDATE"],
                              "resources": ["resourceclaims", "resourceclaimtemplates"], "scope": "Namespaced"},
                             {"apiGroups": ["resource.k8s.io"], "apiVersions": ["v1"],
                              "operations": ["CREATE", "UPDATE"], "resources": ["deviceclasses"], "scope": "Cluster"}]
    (condition,) = hook["matchConditions"]
    assert condition["expression"].count(f"== '{driver}'") == 3
    assert hook["failurePolicy"] == "Ignore" and hook["sideEffects"] == "None"
    assert hook["admissionReviewVersions"] == ["v1"]


def test_failure_policy_and_its_check(helm: Path) -> None:
    r = template(helm, NEURON_CHART, *HOOK_ON, "--set", "draDriver.admissionWebhook.failurePolicy=Fail",
                 "--set", "draDriver.admissionWebhook.replicas=2")
    assert r.get("ValidatingWebhookConfiguration", CHARTS[0][3])["webhooks"][0]["failurePolicy"] == "Fail"
    assert r.get("Deployment", CHARTS[0][3])["spec"]["replicas"] == 2
    for bad in ("failurePolicy=Sometimes", "port=443", "timeoutSeconds=31", "unknownSetting=1"):
        with pytest.raises(RenderError, match="admissionWebhook"):
            template(helm, EFA_CHART, *HOOK_ON, "--set", f"draDriver.admissionWebhook.{bad}")
