"""The control plane's certificates: the usages and names Kubernetes checks (RFC 5280 extensions read back with
the library's parser) and chains that verify against the CA for their TLS purpose (the library's path validation
and ``openssl verify``)."""

from __future__ import annotations

import ipaddress
import subprocess
from pathlib import Path

import pytest
from accel_rig import certs
from cryptography import x509
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509 import verification
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID


def load(path: Path) -> x509.Certificate:
    return x509.load_pem_x509_certificate(path.read_bytes())


def test_subject_keeps_order_and_groups() -> None:
    name = certs.parse_subject("/O=system:nodes/CN=system:node:n1")
    assert [(a.oid, a.value) for a in name] == [(NameOID.ORGANIZATION_NAME, "system:nodes"),
                                                 (NameOID.COMMON_NAME, "system:node:n1")]


@pytest.mark.parametrize("bad", ["CN=x", "/", "/XX=y", "/CN="])
def test_bad_subjects_are_refused_by_name(bad: str) -> None:
    with pytest.raises(ValueError, match="subject"):
        certs.parse_subject(bad)


def test_server_and_client_certificates(tmp_path: Path) -> None:
    ca_crt, ca_key = tmp_path / "ca.crt", tmp_path / "ca.key"
    certs.make_ca(ca_crt, ca_key, "/CN=test-ca", days=2)
    certs.issue(ca_crt, ca_key, tmp_path / "s.crt", tmp_path / "s.key", "/CN=kube-apiserver", days=2,
                server_sans=["IP:127.0.0.1", "DNS:localhost"])
    certs.issue(ca_crt, ca_key, tmp_path / "c.crt", tmp_path / "c.key", "/O=system:masters/CN=admin", days=2)

    ca = load(ca_crt)
    assert ca.extensions.get_extension_for_class(x509.BasicConstraints).value.ca is True
    assert ca.extensions.get_extension_for_class(x509.KeyUsage).value.key_cert_sign is True
    for stem in ("ca", "s", "c"):
        assert (tmp_path / f"{stem}.key").stat().st_mode & 0o777 == 0o600
        key = certs.load_key(tmp_path / f"{stem}.key")
        assert isinstance(key.curve, ec.SECP256R1)

    server = load(tmp_path / "s.crt")
    sans = server.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert sans.get_values_for_type(x509.IPAddress) == [ipaddress.ip_address("127.0.0.1")]
    assert sans.get_values_for_type(x509.DNSName) == ["localhost"]
    assert list(server.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value) == [
        ExtendedKeyUsageOID.SERVER_AUTH]
    store = verification.Store([ca])
    verifier = verification.PolicyBuilder().store(store).build_server_verifier(x509.DNSName("localhost"))
    assert verifier.verify(server, [])[-1] == ca

    client = load(tmp_path / "c.crt")
    assert client.subject.rfc4514_string() == "CN=admin,O=system:masters"
    assert list(client.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value) == [
        ExtendedKeyUsageOID.CLIENT_AUTH]
    assert client.extensions.get_extension_for_class(x509.BasicConstraints).value.ca is False
    # the web-PKI client profile of the library wants a SAN, which Kubernetes client certificates do not carry:
    # OpenSSL's own chain check with the TLS client purpose is the outside judge here
    for cert, purpose in (("c.crt", "sslclient"), ("s.crt", "sslserver")):
        res = subprocess.run(["openssl", "verify", "-CAfile", str(ca_crt), "-purpose", purpose, str(tmp_path / cert)],
                             capture_output=True, text=True, check=False)
        assert res.returncode == 0, res.stdout + res.stderr
    wrong = subprocess.run(["openssl", "verify", "-CAfile", str(ca_crt), "-purpose", "sslserver",
                            str(tmp_path / "c.crt")], capture_output=True, text=True, check=False)
    assert wrong.returncode != 0  # a client certificate is not good for serving
