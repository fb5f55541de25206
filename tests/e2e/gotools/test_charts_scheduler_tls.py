"""The Neuron chart's scheduler.enabled, who may call the extender: mutual TLS by default (the chart's CA signs the
extender's server certificate and my-scheduler's client certificate; kube-scheduler's extender tlsConfig names
the client files), Secrets of your own instead, and a NetworkPolicy that lets only my-scheduler's pods reach the
extender port.

Facts from outside the chart: kube-scheduler's v1 Extender takes ``enableHTTPS`` and ``tlsConfig`` with
``certFile``/``keyFile``/``caFile`` (k8s.io/kube-scheduler config/v1 ExtenderTLSConfig); a Go TLS client checks the
server certificate's DNS SANs against the URL host and needs the serverAuth usage, a server checking clients needs
clientAuth; a ``kubernetes.io/tls`` Secret holds ``tls.crt`` and ``tls.key``; a NetworkPolicy selecting a pod
allows only the ingress its rules list.
"""

from __future__ import annotations

import base64
import posixpath
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml
from chart_render import NEURON_CHART, Rendered, RenderError, container, env_of, template
from cryptography import x509
from cryptography.x509.oid import ExtendedKeyUsageOID

EXTENDER = "neuron-scheduler-extender"


pytestmark = pytest.mark.gotools  # helm, built from Go (the shared fixture in tests/e2e/conftest.py)


@pytest.fixture(scope="module")
def rendered(helm: Path) -> Rendered:
    return template(helm, NEURON_CHART, "--set", "scheduler.enabled=true")


def extender_config(r: Rendered) -> dict[str, Any]:
    config = yaml.safe_load(r.get("ConfigMap", "my-scheduler-config")["data"]["config.yaml"])
    (ext,) = config["extenders"]
    return dict(ext)


def secret_files(r: Rendered, deployment: str, path: str) -> dict[str, bytes]:
    """The files a Deployment's container sees in the directory of ``path``: the Secret volume mounted there."""
    dep = r.get("Deployment", deployment)
    mounts = {m["mountPath"]: m["name"] for m in container(dep).get("volumeMounts", [])}
    volume = mounts[posixpath.dirname(path)]
    (vol,) = [v for v in dep["spec"]["template"]["spec"]["volumes"] if v["name"] == volume]
    secret = r.get("Secret", vol["secret"]["secretName"])
    assert secret["type"] == "kubernetes.io/tls"
    return {name: base64.b64decode(value) for name, value in secret["data"].items()}


def cert(pem: bytes) -> x509.Certificate:
    return x509.load_pem_x509_certificate(pem)


def usages(c: x509.Certificate) -> set[x509.ObjectIdentifier]:
    return set(c.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value)


def test_my_scheduler_calls_the_extender_over_mutual_tls_by_default(rendered: Rendered) -> None:
    ext = extender_config(rendered)
    url = urlsplit(ext["urlPrefix"])
    assert (url.scheme, url.hostname, url.port) == ("https", f"{EXTENDER}.kube-system.svc", 12345)
    assert ext["enableHTTPS"] is True
    tls = ext["tlsConfig"]
    assert set(tls) == {"certFile", "keyFile", "caFile"} and not tls.get("insecure")
    client = secret_files(rendered, "my-scheduler", tls["certFile"])
    names = {posixpath.basename(tls[k]) for k in tls}
    assert names <= client.keys(), f"my-scheduler's tlsConfig names {names}; its Secret holds {set(client)}"

    env = env_of(container(rendered.get("Deployment", EXTENDER)))
    server = secret_files(rendered, EXTENDER, env["TLS_CERT_FILE"])
    for var in ("TLS_CERT_FILE", "TLS_KEY_FILE", "TLS_CLIENT_CA_FILE"):
        assert posixpath.basename(env[var]) in server, var

    # The extender's certificate: for the URL's host, for serving, signed by the CA my-scheduler trusts.
    server_cert = cert(server[posixpath.basename(env["TLS_CERT_FILE"])])
    sans = server_cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert url.hostname in sans.get_values_for_type(x509.DNSName)
    assert ExtendedKeyUsageOID.SERVER_AUTH in usages(server_cert)
    server_cert.verify_directly_issued_by(cert(client[posixpath.basename(tls["caFile"])]))
    # my-scheduler's certificate: for client authentication, signed by the CA the extender checks clients with.
    client_cert = cert(client[posixpath.basename(tls["certFile"])])
    assert ExtendedKeyUsageOID.CLIENT_AUTH in usages(client_cert)
    client_cert.verify_directly_issued_by(cert(server[posixpath.basename(env["TLS_CLIENT_CA_FILE"])]))
    # Each side gets only its own key.
    assert server[posixpath.basename(env["TLS_KEY_FILE"])] != client[posixpath.basename(tls["keyFile"])]


def test_new_certificates_restart_both_sides(rendered: Rendered) -> None:
    sums = {d: rendered.get("Deployment", d)["spec"]["template"]["metadata"]["annotations"]["checksum/tls"]
            for d in ("my-scheduler", EXTENDER)}
    assert len(set(sums.values())) == 1, sums


def test_the_kubelet_probes_the_tls_port_without_a_handshake(rendered: Rendered) -> None:
    c = container(rendered.get("Deployment", EXTENDER))
    assert c["readinessProbe"]["tcpSocket"] == {"port": "extender"}
    assert c["livenessProbe"]["tcpSocket"] == {"port": "extender"}


def test_own_secrets_replace_the_chart_made_ones(helm: Path) -> None:
    r = template(helm, NEURON_CHART, "--set", "scheduler.enabled=true", "--set", "scheduler.tls.serverSecret=ext-tls",
                 "--set", "scheduler.tls.clientSecret=sched-tls")
    assert r.all("Secret") == []
    volumes = {d: {v["secret"]["secretName"] for v in r.get("Deployment", d)["spec"]["template"]["spec"]["volumes"]
                   if "secret" in v} for d in ("my-scheduler", EXTENDER)}
    assert volumes == {"my-scheduler": {"sched-tls"}, EXTENDER: {"ext-tls"}}
    assert extender_config(r)["enableHTTPS"] is True


def test_one_own_secret_without_the_other_is_refused(helm: Path) -> None:
    with pytest.raises(RenderError, match="scheduler.tls"):
        template(helm, NEURON_CHART, "--set", "scheduler.enabled=true", "--set", "scheduler.tls.serverSecret=ext-tls")


def test_tls_off_is_plain_http(helm: Path) -> None:
    r = template(helm, NEURON_CHART, "--set", "scheduler.enabled=true", "--set", "scheduler.tls.enabled=false")
    ext = extender_config(r)
    assert ext["urlPrefix"].startswith("http://") and ext["enableHTTPS"] is False and "tlsConfig" not in ext
    assert r.all("Secret") == []
    assert not {k for k in env_of(container(r.get("Deployment", EXTENDER))) if k.startswith("TLS_")}


def _selects(selector: dict[str, Any], labels: dict[str, str]) -> bool:
    assert set(selector) <= {"matchLabels"}, selector
    return bool(selector.get("matchLabels", {}).items() <= labels.items())


def test_only_my_scheduler_pods_may_reach_the_extender_port(rendered: Rendered) -> None:
    policy = rendered.get("NetworkPolicy", EXTENDER)
    spec = policy["spec"]
    extender = rendered.get("Deployment", EXTENDER)["spec"]["template"]["metadata"]["labels"]
    scheduler = rendered.get("Deployment", "my-scheduler")["spec"]["template"]["metadata"]["labels"]
    assert policy["metadata"]["namespace"] == "kube-system" and spec["policyTypes"] == ["Ingress"]
    assert _selects(spec["podSelector"], extender)
    port = extender_config(rendered)["urlPrefix"].rsplit(":", 1)[1]
    rules_for_port = [rule for rule in spec["ingress"] if any(str(p["port"]) == port for p in rule["ports"])]
    (rule,) = rules_for_port
    (peer,) = rule["from"]  # no namespaceSelector: the policy's own namespace only
    assert set(peer) == {"podSelector"}
    assert _selects(peer["podSelector"], scheduler)
    assert not _selects(peer["podSelector"], extender)
    assert not _selects(peer["podSelector"], {"app.kubernetes.io/name": "some-other-app"})
    # The metrics port is a separate rule (scrapers); it is not the extender port.
    metrics = [rule for rule in spec["ingress"] if rule not in rules_for_port]
    assert [[p["port"] for p in rule["ports"]] for rule in metrics] == [[9813]]


def test_network_policy_can_be_turned_off(helm: Path) -> None:
    r = template(helm, NEURON_CHART, "--set", "scheduler.enabled=true", "--set",
                 "scheduler.networkPolicy.enabled=false")
    assert r.all("NetworkPolicy") == []


def test_reservation_caps_and_scheduler_name_reach_the_extender(helm: Path) -> None:
    r = template(helm, NEURON_CHART, "--set", "scheduler.enabled=true", "--set", "scheduler.name=neuron-sched",
                 "--set", "scheduler.extender.maxReservations=50")
    env = env_of(container(r.get("Deployment", EXTENDER)))
    assert (env["SCHEDULER_NAME"], env["MAX_RESERVATIONS"], env["MAX_RESERVED_NODES"]) == ("neuron-sched", "50",
                                                                                            "131072")
    config = yaml.safe_load(r.get("ConfigMap", "neuron-sched-config")["data"]["config.yaml"])
    assert [p["schedulerName"] for p in config["profiles"]] == ["neuron-sched"]
