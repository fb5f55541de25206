"""The extender's mutual TLS: a server certificate for it, and client certificates required of every caller.

kube-scheduler's extender configuration (``enableHTTPS: true`` and ``tlsConfig`` with ``certFile``, ``keyFile`` and
``caFile``) presents a client certificate; the extender accepts a connection only when that certificate is signed
by ``client_ca`` (the handshake fails otherwise, before any HTTP). The chart makes one CA for both sides.
"""

from __future__ import annotations

import ssl
from pathlib import Path


class TlsConfigError(ValueError):
    """A certificate, key or CA file cannot be used; the message names the file."""


def server_context(cert: Path, key: Path, client_ca: Path) -> ssl.SSLContext:
    """A TLS 1.2+ server context with ``cert``/``key`` that requires a client certificate signed by ``client_ca``."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.verify_mode = ssl.CERT_REQUIRED
    try:
        ctx.load_cert_chain(cert, key)
    except (OSError, ssl.SSLError) as exc:
        raise TlsConfigError(f"cannot use server certificate {cert} with key {key}: {_why(exc)}") from None
    try:
        ctx.load_verify_locations(cafile=client_ca)
    except (OSError, ssl.SSLError) as exc:
        raise TlsConfigError(f"cannot use client CA file {client_ca}: {_why(exc)}") from None
    if not ctx.get_ca_certs():
        raise TlsConfigError(f"client CA file {client_ca} holds no CA certificate")
    return ctx


def _why(exc: BaseException) -> str:
    return getattr(exc, "strerror", None) or getattr(exc, "reason", None) or str(exc) or type(exc).__name__
