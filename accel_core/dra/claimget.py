"""The claim GET of the prepare path: one HTTP/1.1 request spoken with h11 over a blocking TLS socket.

A prepare waits for this read, and it is made from the worker thread that then plans and records the claim (so a
one-claim prepare makes one thread hop, and no event-loop round trips for the read). Through lightkube's HTTP stack
(httpx2, httpcore2, anyio TLS streams) a GET costs about 1.1 ms of our CPU; through h11 on a plain TLS socket,
with the same TLS context, a third of that, and 0.3-0.4 ms less wall time than the same exchange on asyncio's TLS
streams. Everything else (slices, watches, Node updates) stays on lightkube.

It speaks for the kubeconfig users it fully understands: client certificates, a static bearer token, and a token
file that is re-read after a 401 (the in-cluster service account, rotated by the kubelet), as lightkube does.
:meth:`DirectClaimGet.from_config` returns None for anything else (exec plugins, basic auth, an auth provider, a
proxy in the environment), and the caller reads claims through lightkube as before. The answer is decoded into
lightkube's own ``ResourceClaim`` model, so both paths hand the driver the same object, and refuse the same bodies.
Connections are kept ``keepalive`` seconds; a kept connection the server has closed meanwhile is retried once on a
new one. Calls from several threads at once each take their own connection.
"""

from __future__ import annotations

import os
import socket
import ssl
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

import h11
import msgspec
from lightkube.config.client_adapter import verify_cluster
from lightkube.config.kubeconfig import SingleConfig
from lightkube.resources.resource_v1 import ResourceClaim

from accel_core.dra.types import ClaimError

#: With any of these set, claims go through lightkube, which honours proxies (and NO_PROXY).
PROXY_ENV = ("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy", "ALL_PROXY", "all_proxy")
#: A claim is far smaller (etcd stores objects up to 1.5 MiB); a longer answer is refused, not buffered.
MAX_BODY_BYTES = 4 << 20
TIMEOUT_S = 30.0
#: Idle connections kept at most (prepares are serialized; a batch reads its claims at once).
MAX_IDLE = 8
_RECV_BYTES = 65536


class _Stale(Exception):
    """A kept connection was closed by the server before it answered: the request can go again."""


@dataclass
class _Connection:
    sock: socket.socket
    http: h11.Connection = field(default_factory=lambda: h11.Connection(h11.CLIENT))
    idle_since: float = 0.0

    def close(self) -> None:
        self.sock.close()


class DirectClaimGet:
    """GET ``/apis/resource.k8s.io/v1/namespaces/<ns>/resourceclaims/<name>``; names must be checked first."""

    def __init__(self, config: SingleConfig, *, keepalive: float) -> None:
        user = config.user
        if user is None:
            raise ValueError("the kubeconfig context has no user")
        url = urlsplit(config.cluster.server)
        if url.scheme not in ("https", "http") or not url.hostname:
            raise ValueError(f"unsupported API server address {config.cluster.server!r}")
        self._host = url.hostname
        self._port = url.port or (443 if url.scheme == "https" else 80)
        self._authority = url.netloc.rsplit("@", 1)[-1]
        self._prefix = url.path.rstrip("/")
        self._ssl: ssl.SSLContext | None = verify_cluster(config.cluster, user, config.abs_file) \
            if url.scheme == "https" else None
        self._token_file = str(config.abs_file(user.token_file)) if user.token_file else None
        self._token = user.token.strip() if user.token else None
        self._keepalive = keepalive
        self._idle: list[_Connection] = []
        self._lock = threading.Lock()

    @classmethod
    def from_config(cls, config: SingleConfig, *, keepalive: float) -> DirectClaimGet | None:
        """A reader for this kubeconfig, or None when lightkube must do it (see the module docstring)."""
        user = config.user
        if user is None or user.exec or user.auth_provider or user.username or user.password:
            return None
        if any(os.environ.get(name) for name in PROXY_ENV):
            return None
        try:
            return cls(config, keepalive=keepalive)
        except ValueError:
            return None

    def get(self, namespace: str, name: str) -> ResourceClaim | None:
        """The claim, or None when the API server says 404; ClaimError for everything else. Blocks (call it from a
        worker thread); at most :data:`TIMEOUT_S` seconds."""
        target = f"{self._prefix}/apis/resource.k8s.io/v1/namespaces/{namespace}/resourceclaims/{name}"
        deadline = time.monotonic() + TIMEOUT_S
        try:
            status, body = self._send(target, deadline, fresh_token=False)
            if status == 401 and self._token_file:  # the token may have been rotated since it was read
                status, body = self._send(target, deadline, fresh_token=True)
        except (TimeoutError, OSError, ValueError, h11.ProtocolError) as exc:
            raise ClaimError("reading the claim from the API server failed: "
                             f"{type(exc).__name__}: {exc or 'no answer in time'}") from exc
        if status == 404:
            return None
        if status != 200:
            raise ClaimError(f"reading the claim from the API server failed: HTTP {status}: {_message(body)}")
        try:
            return msgspec.json.decode(body, type=ResourceClaim)
        except msgspec.DecodeError as exc:  # not JSON, or not a ResourceClaim (msgspec.ValidationError)
            raise ClaimError(f"the API server sent a malformed claim: {exc}") from exc

    def close(self) -> None:
        with self._lock:
            idle, self._idle = self._idle, []
        for conn in idle:
            conn.close()

    def _send(self, target: str, deadline: float, *, fresh_token: bool) -> tuple[int, bytes]:
        headers = [("Host", self._authority), ("Accept", "application/json"),
                   ("User-Agent", "aws-accel-agents-dra")]
        token = self._bearer(fresh_token)
        if token:
            headers.append(("Authorization", f"Bearer {token}"))
        request = h11.Request(method="GET", target=target, headers=headers)
        conn = self._kept()
        if conn is not None:
            try:
                return self._exchange(conn, request, deadline, reused=True)
            except _Stale:
                pass
        return self._exchange(self._connect(deadline), request, deadline, reused=False)

    def _exchange(self, conn: _Connection, request: h11.Request, deadline: float, *,
                  reused: bool) -> tuple[int, bytes]:
        """One request and its whole answer; the connection goes back to the idle list when it can be reused."""
        answered = False
        try:
            data = conn.http.send(request) + conn.http.send(h11.EndOfMessage())
            conn.sock.settimeout(_remaining(deadline))
            conn.sock.sendall(data)
            status, body = 0, bytearray()
            while True:
                event = conn.http.next_event()
                if event is h11.NEED_DATA:
                    conn.sock.settimeout(_remaining(deadline))
                    conn.http.receive_data(conn.sock.recv(_RECV_BYTES))
                elif isinstance(event, h11.Response):
                    answered = True
                    status = event.status_code
                elif isinstance(event, h11.Data):
                    body += event.data
                    if len(body) > MAX_BODY_BYTES:
                        raise ValueError(f"the answer is longer than {MAX_BODY_BYTES} bytes")
                elif isinstance(event, h11.EndOfMessage):
                    break
                elif isinstance(event, h11.ConnectionClosed):
                    raise h11.RemoteProtocolError("the API server closed the connection mid-answer")
        except BaseException as exc:
            conn.close()
            if reused and not answered and isinstance(exc, OSError | h11.ProtocolError):
                raise _Stale from exc
            raise
        if conn.http.our_state is h11.DONE and conn.http.their_state is h11.DONE:
            conn.http.start_next_cycle()
            conn.idle_since = time.monotonic()
            with self._lock:
                kept = len(self._idle) < MAX_IDLE
                if kept:
                    self._idle.append(conn)
            if not kept:
                conn.close()
        else:
            conn.close()
        return status, bytes(body)

    def _kept(self) -> _Connection | None:
        """The most recently used idle connection still worth trying; older ones are closed."""
        now = time.monotonic()
        while True:
            with self._lock:
                if not self._idle:
                    return None
                conn = self._idle.pop()
            if now - conn.idle_since < self._keepalive:
                return conn
            conn.close()

    def _connect(self, deadline: float) -> _Connection:
        sock = socket.create_connection((self._host, self._port), timeout=_remaining(deadline))
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            if self._ssl is not None:
                sock = self._ssl.wrap_socket(sock, server_hostname=self._host)
        except BaseException:
            sock.close()
            raise
        return _Connection(sock)

    def _bearer(self, fresh: bool) -> str | None:
        if self._token_file and (fresh or self._token is None):
            self._token = Path(self._token_file).read_text().strip()
        return self._token


def _remaining(deadline: float) -> float:
    left = deadline - time.monotonic()
    if left <= 0:
        raise TimeoutError("no answer in time")
    return left


def _message(body: bytes) -> str:
    """The ``message`` of a Kubernetes Status answer, or the start of whatever else was sent."""
    try:
        status = msgspec.json.decode(body)
        if isinstance(status, dict) and isinstance(status.get("message"), str):
            return str(status["message"])[:300]
    except msgspec.DecodeError:
        pass
    return body[:200].decode("utf-8", "replace")
