"""The control plane's certificates and kubeconfigs: a CA, the API server's serving certificate, client
identities (admin, kube-scheduler, kube-controller-manager), the service-account key pair, and one-context
kubeconfig files (certificates made with ``cryptography``, see ``certs``)."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import yaml

from accel_core.atomic import atomic_write_text
from accel_rig import certs
from accel_rig.controlplane_errors import ControlPlaneError

SERVICE_CIDR = "10.0.0.0/24"
#: The "kubernetes" Service's address (first of ``SERVICE_CIDR``): the API server's certificate names it.
SERVICE_IP = "10.0.0.1"
ADMIN_USER = "accel-admin"

_SERVER_SANS = (
    "IP:127.0.0.1",
    f"IP:{SERVICE_IP}",
    "DNS:localhost",
    "DNS:kubernetes",
    "DNS:kubernetes.default",
    "DNS:kubernetes.default.svc",
    "DNS:kubernetes.default.svc.cluster.local",
)

#: Client identities: file stem -> certificate subject. RBAC's bootstrap policy knows the two system users.
_CLIENTS: Mapping[str, str] = {
    "admin": f"/O=system:masters/CN={ADMIN_USER}",
    "scheduler": "/CN=system:kube-scheduler",
    "controller-manager": "/CN=system:kube-controller-manager",
}


@dataclass(frozen=True)
class Pki:
    """Paths of the certificates and keys in one ``pki/`` directory (EC P-256 keys, PEM)."""

    dir: Path

    @property
    def ca_cert(self) -> Path:
        return self.dir / "ca.crt"

    @property
    def ca_key(self) -> Path:
        return self.dir / "ca.key"

    @property
    def apiserver_cert(self) -> Path:
        return self.dir / "apiserver.crt"

    @property
    def apiserver_key(self) -> Path:
        return self.dir / "apiserver.key"

    @property
    def sa_key(self) -> Path:
        """Service-account token signing key (private)."""
        return self.dir / "sa.key"

    @property
    def sa_pub(self) -> Path:
        """Service-account token verification key (public)."""
        return self.dir / "sa.pub"

    def client(self, who: str) -> tuple[Path, Path]:
        """(certificate, key) of a client identity: ``admin``, ``scheduler`` or ``controller-manager``."""
        if who not in _CLIENTS:
            raise KeyError(f"unknown client identity {who!r}; known: {', '.join(_CLIENTS)}")
        return self.dir / f"{who}.crt", self.dir / f"{who}.key"

    def files(self) -> list[Path]:
        paths = [self.ca_cert, self.ca_key, self.apiserver_cert, self.apiserver_key, self.sa_key, self.sa_pub]
        for who in _CLIENTS:
            paths.extend(self.client(who))
        return paths

    def complete(self) -> bool:
        return all(p.is_file() for p in self.files())


def issue_client_cert(pki: Pki, out_dir: Path, stem: str, subject: str, *, days: int = 30) -> tuple[Path, Path]:
    """A client certificate for ``subject`` (e.g. ``/O=system:nodes/CN=system:node:n1``) signed by the cluster CA,
    written as ``<stem>.crt``/``<stem>.key`` in ``out_dir``; returns (certificate, key)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=".cert-", dir=out_dir))
    try:
        certs.issue(pki.ca_cert, pki.ca_key, work / f"{stem}.crt", work / f"{stem}.key", subject, days=days)
        for suffix in (".crt", ".key"):
            (work / f"{stem}{suffix}").replace(out_dir / f"{stem}{suffix}")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return out_dir / f"{stem}.crt", out_dir / f"{stem}.key"


def generate_pki(pki_dir: Path, *, days: int = 30) -> Pki:
    """Make a CA, the API server's serving certificate (127.0.0.1/localhost/kubernetes.* SANs), client
    certificates (admin in ``system:masters``, kube-scheduler, kube-controller-manager) and the
    service-account key pair in ``pki_dir`` (which must not exist yet; it appears complete or not at all)."""
    if pki_dir.exists():
        raise ControlPlaneError(f"{pki_dir} already exists; refusing to overwrite certificates")
    pki_dir.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=".pki-", dir=pki_dir.parent))
    try:
        tmp = Pki(work)
        certs.make_ca(tmp.ca_cert, tmp.ca_key, "/CN=accel-test-ca", days=days)
        certs.issue(tmp.ca_cert, tmp.ca_key, tmp.apiserver_cert, tmp.apiserver_key, "/CN=kube-apiserver",
                    days=days, server_sans=_SERVER_SANS)
        for who, subject in _CLIENTS.items():
            cert, key = tmp.client(who)
            certs.issue(tmp.ca_cert, tmp.ca_key, cert, key, subject, days=days)
        certs.write_public_key(certs.new_key(tmp.sa_key), tmp.sa_pub)
        work.rename(pki_dir)
    except BaseException:
        shutil.rmtree(work, ignore_errors=True)
        raise
    return Pki(pki_dir)


# --------------------------------------------------------------------------------------------------------
# Kubeconfigs


def write_kubeconfig(path: Path, server: str, ca_cert: Path, user_name: str, user: Mapping[str, str]) -> Path:
    """Write a one-context kubeconfig (mode 0600) for ``user`` (client-certificate/-key paths or a token)."""
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "accel", "cluster": {"server": server, "certificate-authority": str(ca_cert)}}],
        "users": [{"name": user_name, "user": dict(user)}],
        "contexts": [{"name": user_name, "context": {"cluster": "accel", "user": user_name, "namespace": "default"}}],
        "current-context": user_name,
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(path, yaml.safe_dump(config, sort_keys=False), mode=0o600, durable=False)
    return path


def cert_user(cert: Path, key: Path) -> dict[str, str]:
    """Kubeconfig user fields for a client certificate and key."""
    return {"client-certificate": str(cert), "client-key": str(key)}


