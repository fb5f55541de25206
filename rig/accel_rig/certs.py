"""Certificates and keys for the test control plane, made with the ``cryptography`` library.

EC P-256 keys written as PKCS#8 PEM (mode 0600), a self-signed CA, and leaf certificates signed by it with the
usages the Kubernetes components check: a serving certificate (``serverAuth`` plus IP/DNS subject alternative
names) for kube-apiserver and client certificates (``clientAuth``) whose subject carries the user (CN) and groups
(O). Subjects are written the way ``openssl -subj`` takes them: ``/O=system:nodes/CN=system:node:n1``.
"""

from __future__ import annotations

import datetime
import ipaddress
from collections.abc import Sequence
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

_ATTRIBUTES = {"CN": NameOID.COMMON_NAME, "O": NameOID.ORGANIZATION_NAME, "OU": NameOID.ORGANIZATIONAL_UNIT_NAME}


def parse_subject(subject: str) -> x509.Name:
    """``/O=a/CN=b`` -> a Name with the attributes in that order; raises ValueError naming a bad part."""
    parts = [p for p in subject.split("/") if p]
    if not subject.startswith("/") or not parts:
        raise ValueError(f"certificate subject {subject!r} must look like /O=group/CN=name")
    attributes = []
    for part in parts:
        key, sep, value = part.partition("=")
        if not sep or key not in _ATTRIBUTES or not value:
            raise ValueError(f"certificate subject {subject!r}: cannot use {part!r} (known: {', '.join(_ATTRIBUTES)})")
        attributes.append(x509.NameAttribute(_ATTRIBUTES[key], value))
    return x509.Name(attributes)


def new_key(path: Path) -> ec.EllipticCurvePrivateKey:
    """A new P-256 key, written to ``path`` as unencrypted PKCS#8 PEM readable by the owner only."""
    key = ec.generate_private_key(ec.SECP256R1())
    pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                            serialization.NoEncryption())
    path.touch(mode=0o600)
    path.chmod(0o600)
    path.write_bytes(pem)
    return key


def load_key(path: Path) -> ec.EllipticCurvePrivateKey:
    key = serialization.load_pem_private_key(path.read_bytes(), password=None)
    if not isinstance(key, ec.EllipticCurvePrivateKey):
        raise ValueError(f"{path}: not an EC private key")
    return key


def write_public_key(key: ec.EllipticCurvePrivateKey, path: Path) -> None:
    """The public half as SubjectPublicKeyInfo PEM (what kube-apiserver's --service-account-key-file reads)."""
    path.write_bytes(key.public_key().public_bytes(serialization.Encoding.PEM,
                                                   serialization.PublicFormat.SubjectPublicKeyInfo))


def _builder(subject: x509.Name, issuer: x509.Name, key: ec.EllipticCurvePrivateKey,
             days: int) -> x509.CertificateBuilder:
    now = datetime.datetime.now(datetime.UTC)
    return (x509.CertificateBuilder().subject_name(subject).issuer_name(issuer).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now)
            .not_valid_after(now + datetime.timedelta(days=days)))


def _leaf_usage() -> x509.KeyUsage:
    return x509.KeyUsage(digital_signature=True, key_encipherment=True, content_commitment=False,
                         data_encipherment=False, key_agreement=False, key_cert_sign=False, crl_sign=False,
                         encipher_only=False, decipher_only=False)


def make_ca(cert_path: Path, key_path: Path, subject: str, *, days: int) -> None:
    """A self-signed CA certificate (``CA:TRUE``, keyCertSign/cRLSign/digitalSignature) and its key."""
    key = new_key(key_path)
    name = parse_subject(subject)
    cert = (_builder(name, name, key, days)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .add_extension(x509.KeyUsage(digital_signature=True, key_encipherment=False, content_commitment=False,
                                         data_encipherment=False, key_agreement=False, key_cert_sign=True,
                                         crl_sign=True, encipher_only=False, decipher_only=False), critical=True)
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
            .sign(key, hashes.SHA256()))
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))


def _san(entry: str) -> x509.GeneralName:
    kind, _, value = entry.partition(":")
    if kind == "IP":
        return x509.IPAddress(ipaddress.ip_address(value))
    if kind == "DNS":
        return x509.DNSName(value)
    raise ValueError(f"subject alternative name {entry!r} must start with IP: or DNS:")


def issue(ca_cert: Path, ca_key: Path, cert_path: Path, key_path: Path, subject: str, *, days: int,
          server_sans: Sequence[str] = ()) -> None:
    """A new key and a certificate for ``subject`` signed by the CA: a serving certificate for ``server_sans``
    (``IP:...``/``DNS:...``) when given, else a client certificate."""
    ca = x509.load_pem_x509_certificate(ca_cert.read_bytes())
    signer = load_key(ca_key)
    key = new_key(key_path)
    builder = (_builder(parse_subject(subject), ca.subject, key, days)
               .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
               .add_extension(_leaf_usage(), critical=True)
               .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(signer.public_key()),
                              critical=False))
    if server_sans:
        builder = (builder.add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
                   .add_extension(x509.SubjectAlternativeName([_san(s) for s in server_sans]), critical=False))
    else:
        builder = builder.add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
    cert_path.write_bytes(builder.sign(signer, hashes.SHA256()).public_bytes(serialization.Encoding.PEM))
