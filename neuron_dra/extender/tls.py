"""The extender's mutual TLS: a server certificate for it, and client certificates required of every caller.

kube-scheduler's extender configuration (``enableHTTPS: true`` and ``tlsConfig`` with ``certFile``, ``keyFile`` and
``caFile``) presents a client certificate; the extender accepts a connection only when that certificate is signed
by ``client_ca`` (the handshake fails otherwise, before any HTTP). The chart makes one CA for both sides.

:class:`FollowedTls` follows the three files: a Secret volume replaces them by flipping its ``..data`` symlink, so
their directories are watched (inotify, and a stat of the files every ``rescan`` seconds as a fallback). A changed
set is loaded into a new context in a thread; the listening context's SNI callback (run once per handshake, with or
without SNI) hands each new connection the newest context, so connections made after a reload get the new
certificate and the new client CA, and open connections keep theirs. A set that cannot be loaded (half-written,
key and certificate not matching) is logged once and the previous one stays in use. The server certificate's
expiry is checked at start and daily: one ERROR line when it has expired, one WARNING when less than
:data:`WARN_DAYS` days or a third of its lifetime is left.
"""

from __future__ import annotations

import asyncio
import datetime
import logging
import os
import ssl
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from prometheus_client import CollectorRegistry, Counter, Gauge

from accel_core.backoff import wait_or_stop
from accel_core.logs import kv
from accel_core.watch import ChangeWatcher
from neuron_dra.extender.certdates import first_pem_der, validity_dates

log = logging.getLogger(__name__)

WARN_DAYS = 30
DAY = 86400.0
#: seconds between stats of the files when no inotify event came (a fallback, e.g. for files behind symlinks)
RESCAN = 60.0

Signature = tuple[tuple[int, int, int, int] | str, ...]


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


@dataclass(frozen=True)
class Validity:
    """A certificate's validity period, in seconds since the epoch."""

    not_before: float
    not_after: float


def validity(cert: Path) -> Validity:
    """The first certificate's validity in the PEM file ``cert`` (TlsConfigError naming the file)."""
    try:
        not_before, not_after = validity_dates(first_pem_der(cert.read_bytes()))
    except (OSError, ValueError) as exc:
        raise TlsConfigError(f"cannot read server certificate {cert}: {_why(exc)}") from None
    return Validity(not_before, not_after)


def expiry_problem(cert: Path, valid: Validity, now: float) -> tuple[int, str] | None:
    """(log level, one line) when the certificate has expired or expires soon, else None."""
    left, when = valid.not_after - now, _iso(valid.not_after)
    if left <= 0:
        return logging.ERROR, (f"server certificate {cert} expired at {when}: my-scheduler refuses the extender "
                               f"and no Neuron pod is scheduled until it is renewed")
    if left < WARN_DAYS * DAY or left * 3 < valid.not_after - valid.not_before:
        return logging.WARNING, (f"server certificate {cert} expires at {when}, in {left / DAY:.1f} days: "
                                 f"renew it (the extender loads renewed files without a restart)")
    return None


class TlsMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.expiry = Gauge("neuron_scheduler_extender_tls_certificate_expiry_timestamp_seconds",
                            "When the server certificate in use expires (seconds since the epoch)", registry=registry)
        self.reloads = Counter("neuron_scheduler_extender_tls_reloads_total",
                               "Loads of changed TLS files, by result (ok, failed: the previous ones stay in use)",
                               ["result"], registry=registry)


class FollowedTls:
    """The listening context (:attr:`context`) for three files, following their changes (see the module doc)."""

    def __init__(self, cert: Path, key: Path, client_ca: Path, registry: CollectorRegistry | None = None, *,
                 clock: Callable[[], float] = time.time) -> None:
        self.files = (cert, key, client_ca)
        self._clock = clock
        self.metrics = TlsMetrics(registry if registry is not None else CollectorRegistry())
        self._signature = self._stat()
        self._failed: Signature | None = None
        self.context = server_context(cert, key, client_ca)  # TlsConfigError: a setting to fix, exit 2
        self.current = self.context
        self.validity = validity(cert)
        self.metrics.expiry.set(self.validity.not_after)
        self.context.sni_callback = self._pick
        self._next_expiry_check = 0.0

    def _pick(self, conn: ssl.SSLObject, server_name: str | None, ctx: ssl.SSLContext) -> None:
        current = self.current
        if current is not ctx:
            conn.context = current

    def _stat(self) -> Signature:
        out: list[tuple[int, int, int, int] | str] = []
        for path in self.files:
            try:
                st = os.stat(path)  # follows the Secret volume's symlinks to the files in use
                out.append((st.st_dev, st.st_ino, st.st_mtime_ns, st.st_size))
            except OSError as exc:
                out.append(_why(exc))
        return tuple(out)

    def reload_if_changed(self) -> bool:
        """Load the files into a new context when they changed since the last load; True when one was loaded.
        Blocking (reads files): run it in a thread."""
        signature = self._stat()
        if signature == self._signature:
            return False
        try:
            fresh = server_context(*self.files)
            valid = validity(self.files[0])
        except TlsConfigError as exc:
            if signature != self._failed:  # once per state of the files, not once per rescan
                self._failed = signature
                self.metrics.reloads.labels("failed").inc()
                log.warning("cannot load the changed TLS files; still serving the previous ones",
                            extra=kv(error=str(exc)[:300]))
            return False
        self._signature, self._failed = signature, None
        self.current, self.validity = fresh, valid
        self.metrics.expiry.set(valid.not_after)
        self.metrics.reloads.labels("ok").inc()
        log.info("TLS files reloaded: new connections use them",
                 extra=kv(cert=str(self.files[0]), not_after=_iso(valid.not_after)))
        self._next_expiry_check = 0.0
        return True

    def check_expiry(self) -> tuple[int, str] | None:
        """Log (and return) the expiry problem of the certificate in use, at most once a day unless it changed."""
        now = self._clock()
        if now < self._next_expiry_check:
            return None
        self._next_expiry_check = now + DAY
        problem = expiry_problem(self.files[0], self.validity, now)
        if problem is not None:
            log.log(problem[0], problem[1])
        return problem

    async def follow(self, stop: asyncio.Event, *, rescan: float = RESCAN) -> None:
        """Reload on changes until ``stop``; checks the expiry at start and daily."""
        self.check_expiry()
        try:
            async with ChangeWatcher(lambda: self.files, rescan_interval=rescan, depth=0, debounce=0.2) as watcher:
                async for _ in watcher.changes(stop):
                    await self._check()
            return
        except OSError as exc:  # no inotify instance left: the stats alone still find a change
            log.warning("cannot watch the TLS files; checking them every rescan interval",
                        extra=kv(error=_why(exc), rescan=rescan))
        while not stop.is_set():
            await wait_or_stop(stop, rescan)
            await self._check()

    async def _check(self) -> None:
        await asyncio.to_thread(self.reload_if_changed)
        self.check_expiry()


def _iso(ts: float) -> str:
    return datetime.datetime.fromtimestamp(ts, datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
