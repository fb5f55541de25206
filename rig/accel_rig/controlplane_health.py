"""Readiness probes of the control plane's components: etcd's ``/health``, the API server's ``/readyz`` (as the
admin) and the ``/healthz`` of kube-scheduler and kube-controller-manager, all on 127.0.0.1."""

from __future__ import annotations

import contextlib
import http.client
import json
import ssl

from accel_rig.controlplane_pki import Pki


def etcd_ready(port: int) -> bool:
    status, body = _http_get("http", port, "/health", None)
    if status != 200:
        return False
    with contextlib.suppress(ValueError, AttributeError):
        return str(json.loads(body).get("health")) == "true"
    return False


def apiserver_ready(port: int, pki: Pki) -> bool:
    cert, key = pki.client("admin")
    ctx = ssl.create_default_context(cafile=str(pki.ca_cert))
    ctx.load_cert_chain(str(cert), str(key))
    status, _ = _http_get("https", port, "/readyz", ctx)
    return status == 200


def component_healthy(port: int) -> bool:
    # kube-scheduler and kube-controller-manager serve a self-signed certificate.
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    status, _ = _http_get("https", port, "/healthz", ctx)
    return status == 200


def _http_get(scheme: str, port: int, path: str, ctx: ssl.SSLContext | None) -> tuple[int, str]:
    """(status, body) of a GET to 127.0.0.1, or (0, error text) when nothing answers yet."""
    conn: http.client.HTTPConnection
    if scheme == "https":
        conn = http.client.HTTPSConnection("127.0.0.1", port, context=ctx, timeout=3)
    else:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=3)
    try:
        conn.request("GET", path)
        resp = conn.getresponse()
        return resp.status, resp.read().decode("utf-8", "replace")
    except (OSError, http.client.HTTPException) as e:
        return 0, str(e)
    finally:
        conn.close()
