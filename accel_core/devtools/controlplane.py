"""Run the real Kubernetes control plane (etcd, kube-apiserver, kube-scheduler, kube-controller-manager) on
127.0.0.1 for tests and for people.

Everything lives in one state directory: ``pki/`` (certificates made with ``cryptography``, see ``certs``),
``etcd/`` (data), ``logs/<component>.log``, the admin kubeconfig and ``cluster.json`` (ports and PIDs, read by
``accel-cluster down``/``status``). Binaries come from ``scripts/build-kube.sh`` (see ``kubeversions``).

Typical use::

    with ControlPlane() as cp:           # owns a temp dir, removed on exit
        token = cp.mint_token("default", "default")
        kubeconfig = cp.kubeconfig_for_token(token)
"""

from __future__ import annotations

import contextlib
import ctypes
import hashlib
import http.client
import json
import os
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any

import httpx2
import psutil
import yaml
from lightkube import ApiError, Client, KubeConfig
from lightkube.config.models import Cluster, User
from lightkube.models.authentication_v1 import BoundObjectReference, TokenRequestSpec
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.core_v1 import Node, NodeStatus, Pod, ServiceAccountToken
from lightkube.types import PatchType

from accel_core.devtools import certs
from accel_core.devtools.kubeversions import KUBE_BINARIES, build_script, kube_bin_dir

ETCD = "etcd"
APISERVER = "kube-apiserver"
SCHEDULER = "kube-scheduler"
CONTROLLER_MANAGER = "kube-controller-manager"
#: Start order; ``stop`` goes the other way.
COMPONENTS = (ETCD, APISERVER, SCHEDULER, CONTROLLER_MANAGER)

SERVICE_CIDR = "10.0.0.0/24"
SERVICE_IP = "10.0.0.1"
SERVICE_ACCOUNT_ISSUER = "https://kubernetes.default.svc.cluster.local"
#: Feature gates passed to all three kube components. None are needed with v1.37: DynamicResourceAllocation,
#: DRADeviceTaints, DRADeviceTaintRules, DRAPrioritizedList and ServiceAccountTokenNodeBinding/PodNodeInfo are
#: GA there (setting them only logs "setting GA feature gate"), and naming a removed gate is a start-up error.
DEFAULT_FEATURE_GATES: Mapping[str, bool] = {}
#: ``--runtime-config`` entries. v1.37 serves resource.k8s.io/v1 (deviceclasses, devicetaintrules,
#: resourceclaims, resourceclaimtemplates, resourceslices) and ValidatingAdmissionPolicy by default.
DEFAULT_RUNTIME_CONFIG: tuple[str, ...] = ()
#: Controllers left out of kube-controller-manager. Without a kubelet, node-lifecycle would mark every
#: fake Node NotReady and taint it, and the scheduler would then refuse it.
DISABLED_CONTROLLERS: tuple[str, ...] = ("node-lifecycle-controller",)
STATE_FILE = "cluster.json"
ADMIN_USER = "accel-admin"

_PORT_CLASH = "address already in use"
_STOP_STAGES: tuple[tuple[str, ...], ...] = ((CONTROLLER_MANAGER, SCHEDULER), (APISERVER,), (ETCD,))


class ControlPlaneError(RuntimeError):
    """The control plane could not be started, queried or stopped; the message says why."""


class MissingBinariesError(ControlPlaneError):
    """A needed binary is not in the binaries directory."""


class ApiRequestError(ControlPlaneError):
    """The API server answered a request with an error status."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


class _PortClash(Exception):
    """A component exited because one of its ports was taken meanwhile."""


# --------------------------------------------------------------------------------------------------------
# Certificates


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
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        yaml.safe_dump(config, f, sort_keys=False)
    tmp.replace(path)
    return path


def _cert_user(cert: Path, key: Path) -> dict[str, str]:
    return {"client-certificate": str(cert), "client-key": str(key)}


# --------------------------------------------------------------------------------------------------------
# Processes and the state record


@dataclass(frozen=True)
class ProcessRecord:
    """One running component as written to ``cluster.json``."""

    name: str
    pid: int
    #: The process's start time in clock ticks since boot (``/proc/PID/stat`` field 22): unlike psutil's
    #: ``create_time``, which is derived from the wall clock, it does not move when the clock is stepped.
    start_ticks: int
    log: str
    ports: tuple[int, ...]

    @classmethod
    def of(cls, name: str, pid: int, log: str, ports: tuple[int, ...] = ()) -> ProcessRecord | None:
        """A record of the running process ``pid``, or None when it is gone."""
        ticks = process_start_ticks(pid)
        return None if ticks is None else cls(name, pid, ticks, log, ports)

    @classmethod
    def from_json(cls, raw: Mapping[str, Any]) -> ProcessRecord:
        """Parse one record; a record of an older version (``create_time``, wall clock) names no live process."""
        return cls(name=str(raw["name"]), pid=int(raw["pid"]), start_ticks=int(raw.get("start_ticks", -1)),
                   log=str(raw["log"]), ports=tuple(int(x) for x in raw.get("ports", ())))


def process_start_ticks(pid: int) -> int | None:
    """Field 22 of ``/proc/PID/stat`` (start time in clock ticks after boot), or None when the process is gone.
    The command name (field 2) is in parentheses and may hold spaces or parentheses: split after the last ``)``."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = text[text.rfind(")") + 2:].split()
    try:
        return int(fields[19])  # fields[0] is field 3 (state)
    except (IndexError, ValueError):
        return None


@dataclass(frozen=True)
class ClusterRecord:
    """``cluster.json``: what ``accel-cluster`` needs to find a running control plane again."""

    server: str
    admin_kubeconfig: str
    ca_cert: str
    processes: tuple[ProcessRecord, ...] = ()
    ports: Mapping[str, tuple[int, ...]] = field(default_factory=dict)

    def save(self, state_dir: Path) -> None:
        tmp = state_dir / (STATE_FILE + ".tmp")
        tmp.write_text(json.dumps(asdict(self), indent=2) + "\n")
        tmp.replace(state_dir / STATE_FILE)

    @classmethod
    def load(cls, state_dir: Path) -> ClusterRecord | None:
        """The record in ``state_dir``, or None when there is none; a damaged file is an error naming it."""
        path = state_dir / STATE_FILE
        try:
            raw = json.loads(path.read_text())
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as e:
            raise ControlPlaneError(f"cannot read {path}: {e}") from e
        try:
            procs = tuple(ProcessRecord.from_json(p) for p in raw.get("processes", []))
            ports = {str(k): tuple(int(x) for x in v) for k, v in raw.get("ports", {}).items()}
            return cls(
                server=str(raw["server"]),
                admin_kubeconfig=str(raw["admin_kubeconfig"]),
                ca_cert=str(raw["ca_cert"]),
                processes=procs,
                ports=ports,
            )
        except (KeyError, TypeError, ValueError) as e:
            raise ControlPlaneError(f"{path} is damaged ({e!r}); remove it and start again") from e


def recorded_process(rec: ProcessRecord) -> psutil.Process | None:
    """The live process a record names, or None if it is gone (or its PID now belongs to another process: its
    start time in clock ticks differs, which a step of the wall clock cannot cause)."""
    try:
        proc = psutil.Process(rec.pid)
        if process_start_ticks(rec.pid) != rec.start_ticks or proc.status() == psutil.STATUS_ZOMBIE:
            return None
        return proc
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return None


def terminate_processes(procs: Sequence[psutil.Process], timeout: float) -> None:
    """SIGTERM each process, wait up to ``timeout`` seconds, then SIGKILL and reap what is left."""
    for p in procs:
        with contextlib.suppress(psutil.NoSuchProcess):
            p.terminate()
    _, alive = psutil.wait_procs(list(procs), timeout=timeout)
    for p in alive:
        with contextlib.suppress(psutil.NoSuchProcess):
            p.kill()
    # a killed process still in an fsync (etcd on a busy disk) exits only when the write returns
    _, stuck = psutil.wait_procs(alive, timeout=30)
    for p in stuck:
        print(f"process {p.pid} still running 30 s after SIGKILL", file=sys.stderr)


def stop_recorded(state_dir: Path, timeout: float = 15.0) -> list[str]:
    """Stop the processes ``cluster.json`` in ``state_dir`` lists (in reverse start order); return the names
    of those that were running. The record is kept, without processes, so a later start reuses its ports."""
    record = ClusterRecord.load(state_dir)
    if record is None:
        return []
    stopped: list[str] = []
    by_name = {r.name: r for r in record.processes}
    for stage in _STOP_STAGES:
        live = []
        for name in stage:
            rec = by_name.get(name)
            proc = recorded_process(rec) if rec else None
            if proc is not None:
                live.append(proc)
                stopped.append(name)
        terminate_processes(live, timeout)
    ClusterRecord(record.server, record.admin_kubeconfig, record.ca_cert, (), record.ports).save(state_dir)
    return stopped


def _die_with_parent() -> None:
    """Runs in the child before exec: ask the kernel to SIGKILL it when the parent dies
    (no one is left to wait for a graceful stop, and the API server can hang once etcd is gone)."""
    if sys.platform.startswith("linux"):
        pr_set_pdeathsig = 1
        ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, int(signal.SIGKILL))


def spawn_logged(cmd: Sequence[str], log_path: Path, *, cwd: Path, detach: bool) -> tuple[subprocess.Popen[bytes], int]:
    """Start ``cmd`` in its own session with stdout/stderr appended to ``log_path`` (after a header line); returns
    the process and the log offset where its output starts. Without ``detach`` the child dies with its parent."""
    env = {k: v for k, v in os.environ.items() if k != "KUBECONFIG"}
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with log_path.open("ab") as log:
        offset = log.tell()
        log.write(f"--- {time.strftime('%Y-%m-%dT%H:%M:%S')} {' '.join(cmd)}\n".encode())
        log.flush()
        proc = subprocess.Popen(
            list(cmd),
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=cwd,
            env=env,
            start_new_session=True,
            preexec_fn=None if detach else _die_with_parent,
        )
    return proc, offset


def tail_file(path: Path, lines: int) -> str:
    """The last ``lines`` lines of a (log) file, or a note that it cannot be read."""
    return _tail(path, lines)


def _tail(path: Path, lines: int) -> str:
    try:
        with path.open("rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - 256 * 1024))
            data = f.read()
    except OSError as e:
        return f"(cannot read {path}: {e})"
    return "\n".join(data.decode("utf-8", "replace").splitlines()[-lines:])


@dataclass
class _Component:
    name: str
    log_path: Path
    process: subprocess.Popen[bytes]
    ports: tuple[int, ...]
    log_offset: int


# --------------------------------------------------------------------------------------------------------
# Admin API access


@dataclass(frozen=True)
class AdminApi:
    """A lightkube client for a running API server (``https://127.0.0.1:PORT``) with the admin client certificate.

    Objects are typed lightkube models, so a misspelt field fails before it is sent. API errors and transport
    failures come out as :class:`ApiRequestError` / :class:`ControlPlaneError` naming the call (see ``errors``).
    """

    server: str
    pki: Pki
    timeout: float = 15.0

    def client(self) -> Client:
        cert, key = self.pki.client("admin")
        config = KubeConfig.from_one(
            cluster=Cluster(server=self.server, certificate_auth=str(self.pki.ca_cert)),
            user=User(client_cert=str(cert), client_key=str(key)),
            namespace="default",
        )
        # trust_env=False: a proxy from the environment must not sit between the tool and 127.0.0.1
        return Client(config=config, timeout=httpx2.Timeout(self.timeout), trust_env=False)

    @staticmethod
    @contextlib.contextmanager
    def errors(what: str) -> Iterator[None]:
        """Turn lightkube/httpx failures of ``what`` into ControlPlaneError (ApiRequestError for an HTTP status)."""
        try:
            yield
        except ApiError as e:
            code = e.status.code or (e.response.status_code if e.response is not None else 0)
            raise ApiRequestError(code, f"{what} -> HTTP {code}: {e.status.message}") from e
        except (OSError, httpx2.HTTPError) as e:
            raise ControlPlaneError(f"{what} failed: {e}") from e


# --------------------------------------------------------------------------------------------------------
# The control plane


class ControlPlane:
    """etcd + kube-apiserver (+ kube-scheduler, kube-controller-manager) on 127.0.0.1 with free ports.

    ``state_dir=None`` makes a temporary directory that ``close()`` (and leaving a ``with`` block) removes;
    a given directory is kept, and an existing one is reused (certificates, etcd data, preferred ports).
    With ``detach=True`` the processes outlive this Python process (``accel-cluster up``); otherwise the
    kernel stops them if the thread that started them dies. ``etcd_fsync=False`` trades durability for
    speed, which suits throw-away test clusters.
    """

    def __init__(
        self,
        state_dir: Path | str | None = None,
        *,
        with_scheduler: bool = True,
        with_controller_manager: bool = True,
        bin_dir: Path | None = None,
        detach: bool = False,
        startup_timeout: float = 120.0,
        stop_timeout: float = 15.0,
        etcd_fsync: bool = False,
        feature_gates: Mapping[str, bool] | None = None,
        extra_args: Mapping[str, Sequence[str]] | None = None,
        verbosity: int = 0,
        cert_days: int = 30,
    ) -> None:
        self._owns_dir = state_dir is None
        self._state_dir = Path(tempfile.mkdtemp(prefix="accel-cp-")) if state_dir is None else Path(state_dir)
        self._state_dir = self._state_dir.resolve()
        self.with_scheduler = with_scheduler
        self.with_controller_manager = with_controller_manager
        self.bin_dir = Path(bin_dir) if bin_dir is not None else kube_bin_dir()
        self._detach = detach
        self._startup_timeout = startup_timeout
        self._stop_timeout = stop_timeout
        self._etcd_fsync = etcd_fsync
        self._feature_gates = {**DEFAULT_FEATURE_GATES, **(feature_gates or {})}
        self._extra_args = {k: list(v) for k, v in (extra_args or {}).items()}
        unknown = set(self._extra_args) - set(COMPONENTS)
        if unknown:
            raise ValueError(f"extra_args for unknown components {sorted(unknown)}; known: {COMPONENTS}")
        self._verbosity = verbosity
        self._cert_days = cert_days
        self._components: dict[str, _Component] = {}
        self._handed_out: set[int] = set()
        self._preferred_ports: dict[str, tuple[int, ...]] = {}
        #: Seconds from the start of ``start()`` until each step finished ("pki", then the components).
        self.startup_times: dict[str, float] = {}
        self._t0 = 0.0

    # ---- paths and addresses

    @property
    def state_dir(self) -> Path:
        return self._state_dir

    @property
    def log_dir(self) -> Path:
        return self._state_dir / "logs"

    @property
    def pki(self) -> Pki:
        return Pki(self._state_dir / "pki")

    @property
    def ca_cert(self) -> Path:
        return self.pki.ca_cert

    @property
    def admin_kubeconfig(self) -> Path:
        return self._state_dir / "admin.kubeconfig"

    @property
    def apiserver_port(self) -> int:
        comp = self._components.get(APISERVER)
        if comp is None:
            raise ControlPlaneError("the API server is not running")
        return comp.ports[0]

    @property
    def server(self) -> str:
        """The API server URL, e.g. ``https://127.0.0.1:41234``."""
        return f"https://127.0.0.1:{self.apiserver_port}"

    @property
    def etcd_url(self) -> str:
        comp = self._components.get(ETCD)
        if comp is None:
            raise ControlPlaneError("etcd is not running")
        return f"http://127.0.0.1:{comp.ports[0]}"

    def binary(self, name: str) -> Path:
        """Path of a binary (``kube-apiserver``, ``etcd``, ``helm``, ...); raises if it is missing."""
        self._require_binaries([name])
        return self.bin_dir / name

    @property
    def helm(self) -> Path:
        return self.binary("helm")

    @property
    def kubectl(self) -> Path:
        return self.binary("kubectl")

    # ---- lifecycle

    def __enter__(self) -> ControlPlane:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def start(self) -> ControlPlane:
        """Start the components in order and wait until each is healthy. On any failure the ones already
        started are stopped and a ControlPlaneError carrying the failing component's log tail is raised."""
        if self._components:
            raise ControlPlaneError("this control plane is already started")
        wanted = [ETCD, APISERVER]
        if self.with_scheduler:
            wanted.append(SCHEDULER)
        if self.with_controller_manager:
            wanted.append(CONTROLLER_MANAGER)
        self._require_binaries(wanted)
        self._t0 = time.monotonic()
        self.startup_times = {}
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self._refuse_if_running()
        if not self.pki.complete():
            if self.pki.dir.exists():
                raise ControlPlaneError(f"{self.pki.dir} is incomplete; remove it to make new certificates")
            generate_pki(self.pki.dir, days=self._cert_days)
        self.startup_times["pki"] = time.monotonic() - self._t0
        previous = ClusterRecord.load(self._state_dir)
        self._preferred_ports = dict(previous.ports) if previous else {}
        try:
            self._launch(ETCD, 2, self._etcd_argv, self._etcd_ready)
            self._launch(APISERVER, 1, self._apiserver_argv, self._apiserver_ready)
            self._write_kubeconfigs()
            if self.with_scheduler:
                self._launch(SCHEDULER, 1, self._scheduler_argv, self._component_healthy)
            if self.with_controller_manager:
                self._launch(CONTROLLER_MANAGER, 1, self._controller_manager_argv, self._component_healthy)
        except BaseException:
            self.stop()
            raise
        self._save_record()
        return self

    def stop(self) -> None:
        """Stop all components (SIGTERM, then SIGKILL after the stop timeout). Logs and state stay."""
        for stage in _STOP_STAGES:
            procs = [self._components[n].process for n in stage if n in self._components]
            for p in procs:
                if p.poll() is None:
                    with contextlib.suppress(ProcessLookupError):
                        p.send_signal(signal.SIGTERM)
            deadline = time.monotonic() + self._stop_timeout
            for p in procs:
                try:
                    p.wait(timeout=max(0.1, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait(timeout=10)
        had_components = bool(self._components)
        self._components.clear()
        if had_components and self._state_dir.exists():
            self._save_record()

    def close(self) -> None:
        """``stop()``, then remove the state directory if this object created it."""
        self.stop()
        if self._owns_dir:
            shutil.rmtree(self._state_dir, ignore_errors=True)

    @property
    def running(self) -> dict[str, bool]:
        """Component name -> whether its process is still alive."""
        return {n: c.process.poll() is None for n, c in self._components.items()}

    def pids(self) -> dict[str, int]:
        return {n: c.process.pid for n, c in self._components.items()}

    def logs_tail(self, lines: int = 40, components: Sequence[str] = COMPONENTS) -> str:
        """The last ``lines`` lines of each component's log, headed by the log path (for failure reports)."""
        parts = []
        for name in components:
            path = self.log_dir / f"{name}.log"
            if path.exists():
                parts.append(f"==> {path} <==\n{_tail(path, lines)}")
        return "\n\n".join(parts) if parts else f"(no logs in {self.log_dir})"

    # ---- API helpers

    def admin_api(self, *, timeout: float = 15.0) -> AdminApi:
        """Typed API access as the admin user (see :class:`AdminApi`)."""
        return AdminApi(self.server, self.pki, timeout)

    def mint_token(
        self,
        namespace: str,
        service_account: str,
        audiences: Sequence[str] | None = None,
        *,
        bound_pod: str | None = None,
        bound_node: str | None = None,
        expiration_seconds: int = 3600,
    ) -> str:
        """A service-account token from the TokenRequest API.

        ``bound_node`` binds it to that Node and ``bound_pod`` to that Pod in ``namespace``; both put the
        ``authentication.kubernetes.io/node-name`` claim in the token (for a Pod, once it is scheduled).
        ``audiences=None`` means the API server's own audience. Expiry is at least 600 s (API rule).
        """
        if bound_pod and bound_node:
            raise ValueError("bind the token to a Pod or to a Node, not both")
        spec = TokenRequestSpec(expirationSeconds=expiration_seconds, audiences=list(audiences) if audiences else None)
        api = self.admin_api()
        client = api.client()
        try:
            if bound_pod:
                with api.errors(f"GET pod {namespace}/{bound_pod}"):
                    pod = client.get(Pod, bound_pod, namespace=namespace)
                spec.boundObjectRef = BoundObjectReference(kind="Pod", apiVersion="v1", name=bound_pod,
                                                           uid=pod.metadata.uid if pod.metadata else None)
            if bound_node:
                with api.errors(f"GET node {bound_node}"):
                    node = client.get(Node, bound_node)
                spec.boundObjectRef = BoundObjectReference(kind="Node", apiVersion="v1", name=bound_node,
                                                           uid=node.metadata.uid if node.metadata else None)
            with api.errors(f"TokenRequest for {namespace}/{service_account}"):
                result = client.create(ServiceAccountToken(metadata=ObjectMeta(), spec=spec), service_account,
                                       namespace=namespace)
        finally:
            client.close()
        token = result.status.token if result.status else None
        if not isinstance(token, str) or not token:
            raise ControlPlaneError(f"TokenRequest for {namespace}/{service_account} returned no token")
        return token

    def kubeconfig_for_token(self, token: str, name: str | None = None) -> Path:
        """Write a kubeconfig that authenticates with ``token``; returns its path (in the state dir)."""
        digest = hashlib.sha256(token.encode()).hexdigest()[:12]
        user = name or f"token-{digest}"
        path = self._state_dir / "kubeconfigs" / f"{user}.kubeconfig"
        return write_kubeconfig(path, self.server, self.ca_cert, user, {"token": token})

    def create_fake_node(
        self,
        name: str,
        *,
        cpu: str = "8",
        memory: str = "32Gi",
        pods: str = "110",
        labels: Mapping[str, str] | None = None,
    ) -> dict[str, Any]:
        """Create a Node the scheduler accepts although no kubelet runs behind it; return the Node.

        It gets capacity/allocatable for cpu, memory and pods and a Ready condition (status subresource),
        and loses the ``node.kubernetes.io/not-ready`` taint that admission puts on every new Node (the
        node-lifecycle controller, which would lift it, is off). Nothing renews it, so it stays as made.
        """
        node_labels = {"kubernetes.io/hostname": name, "kubernetes.io/os": "linux", **(labels or {})}
        now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        resources = {"cpu": cpu, "memory": memory, "pods": pods}
        ready = {"type": "Ready", "status": "True", "reason": "KubeletReady", "message": "fake node (no kubelet)",
                 "lastHeartbeatTime": now, "lastTransitionTime": now}
        status = {"capacity": resources, "allocatable": resources, "conditions": [ready]}
        api = self.admin_api()
        client = api.client()
        try:
            with api.errors(f"create node {name}"):
                client.create(Node(metadata=ObjectMeta(name=name, labels=node_labels)))
            with api.errors(f"patch node {name} status"):
                client.patch(NodeStatus, name, {"status": status}, patch_type=PatchType.MERGE)
            with api.errors(f"patch node {name}"):
                node = client.patch(Node, name, {"spec": {"taints": None}}, patch_type=PatchType.MERGE)
        finally:
            client.close()
        return node.to_dict()

    # ---- internals: binaries, ports, processes

    def _require_binaries(self, names: Sequence[str]) -> None:
        missing = [n for n in names if not os.access(self.bin_dir / n, os.X_OK)]
        if missing:
            raise MissingBinariesError(
                f"missing {', '.join(missing)} in {self.bin_dir}. Build them with {build_script()} "
                "(10-20 minutes the first time, cached afterwards), or set ACCEL_KUBE_BIN to a "
                "directory that has " + ", ".join(KUBE_BINARIES) + "."
            )

    def _refuse_if_running(self) -> None:
        record = ClusterRecord.load(self._state_dir)
        if record is None:
            return
        live = [r.name for r in record.processes if recorded_process(r) is not None]
        if live:
            raise ControlPlaneError(
                f"{', '.join(live)} from {self._state_dir} still running; stop them first (accel-cluster down)"
            )

    def _pick_ports(self, name: str, count: int, attempt: int) -> tuple[int, ...]:
        wanted = list(self._preferred_ports.get(name, ()))[:count] if attempt == 0 else []
        wanted += [0] * (count - len(wanted))
        return tuple(self._free_port(w) for w in wanted)

    def _free_port(self, want: int) -> int:
        for _ in range(50):
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
                try:
                    s.bind(("127.0.0.1", want))
                except OSError:
                    want = 0
                    continue
                port = int(s.getsockname()[1])
            if port not in self._handed_out:
                self._handed_out.add(port)
                return port
            want = 0
        raise ControlPlaneError("no free TCP port on 127.0.0.1")

    def _launch(
        self,
        name: str,
        port_count: int,
        argv: Callable[[tuple[int, ...]], list[str]],
        ready: Callable[[_Component], bool],
    ) -> None:
        for attempt in range(3):
            ports = self._pick_ports(name, port_count, attempt)
            cmd = [str(self.bin_dir / name), *argv(ports), *self._extra_args.get(name, [])]
            log_path = self.log_dir / f"{name}.log"
            comp = self._spawn(name, cmd, log_path, ports)
            self._components[name] = comp
            try:
                self._wait_ready(comp, ready)
                self.startup_times[name] = time.monotonic() - self._t0
                return
            except _PortClash:
                comp.process.wait(timeout=10)
                del self._components[name]
        raise ControlPlaneError(f"{name}: its ports were taken three times in a row\n{self.logs_tail(30, [name])}")

    def _spawn(self, name: str, cmd: list[str], log_path: Path, ports: tuple[int, ...]) -> _Component:
        proc, offset = spawn_logged(cmd, log_path, cwd=self._state_dir, detach=self._detach)
        return _Component(name, log_path, proc, ports, offset)

    def _wait_ready(self, comp: _Component, ready: Callable[[_Component], bool]) -> None:
        deadline = time.monotonic() + self._startup_timeout
        while True:
            rc = comp.process.poll()
            if rc is not None:
                with comp.log_path.open("rb") as f:
                    f.seek(comp.log_offset)
                    since_start = f.read().decode("utf-8", "replace")
                if _PORT_CLASH in since_start.lower():
                    raise _PortClash(comp.name)
                raise ControlPlaneError(
                    f"{comp.name} exited with code {rc} during start-up (log {comp.log_path}):\n"
                    + "\n".join(since_start.splitlines()[-40:])
                )
            if ready(comp):
                return
            if time.monotonic() > deadline:
                raise ControlPlaneError(
                    f"{comp.name} was not ready within {self._startup_timeout:.0f}s (log {comp.log_path}):\n"
                    + _tail(comp.log_path, 40)
                )
            time.sleep(0.2)

    def _save_record(self) -> None:
        procs = []
        for comp in self._components.values():
            rec = ProcessRecord.of(comp.name, comp.process.pid, str(comp.log_path), comp.ports)
            if rec is not None:
                procs.append(rec)
        ports = dict(self._preferred_ports)
        ports.update({c.name: c.ports for c in self._components.values()})
        server = self.server if APISERVER in self._components else ""
        ClusterRecord(server, str(self.admin_kubeconfig), str(self.ca_cert), tuple(procs), ports).save(self._state_dir)

    def _write_kubeconfigs(self) -> None:
        write_kubeconfig(
            self.admin_kubeconfig, self.server, self.ca_cert, ADMIN_USER, _cert_user(*self.pki.client("admin"))
        )
        for who in ("scheduler", "controller-manager"):
            write_kubeconfig(
                self._state_dir / f"{who}.kubeconfig", self.server, self.ca_cert, f"system:kube-{who}",
                _cert_user(*self.pki.client(who)),
            )  # fmt: skip

    # ---- internals: command lines

    def _common_kube_flags(self) -> list[str]:
        flags = [f"--v={self._verbosity}"]
        if self._feature_gates:
            gates = ",".join(f"{k}={'true' if v else 'false'}" for k, v in sorted(self._feature_gates.items()))
            flags.append(f"--feature-gates={gates}")
        return flags

    def _etcd_argv(self, ports: tuple[int, ...]) -> list[str]:
        client, peer = (f"http://127.0.0.1:{p}" for p in ports)
        return [
            "--name=accel",
            f"--data-dir={self._state_dir / 'etcd'}",
            f"--listen-client-urls={client}",
            f"--advertise-client-urls={client}",
            f"--listen-peer-urls={peer}",
            f"--initial-advertise-peer-urls={peer}",
            f"--initial-cluster=accel={peer}",
            "--log-level=warn",
            f"--unsafe-no-fsync={'false' if self._etcd_fsync else 'true'}",
        ]

    def _apiserver_argv(self, ports: tuple[int, ...]) -> list[str]:
        pki = self.pki
        flags = [
            f"--etcd-servers={self.etcd_url}",
            "--bind-address=127.0.0.1",
            "--advertise-address=127.0.0.1",
            f"--secure-port={ports[0]}",
            f"--cert-dir={self._state_dir / 'apiserver-certs'}",
            f"--tls-cert-file={pki.apiserver_cert}",
            f"--tls-private-key-file={pki.apiserver_key}",
            f"--client-ca-file={pki.ca_cert}",
            f"--service-account-issuer={SERVICE_ACCOUNT_ISSUER}",
            f"--service-account-key-file={pki.sa_pub}",
            f"--service-account-signing-key-file={pki.sa_key}",
            "--authorization-mode=Node,RBAC",
            # No front proxy; naming a request-header CA (with an identity no certificate has) only keeps
            # kube-scheduler/controller-manager from logging that the bundle is missing.
            f"--requestheader-client-ca-file={pki.ca_cert}",
            "--requestheader-allowed-names=accel-front-proxy-unused",
            "--requestheader-username-headers=X-Remote-User",
            "--requestheader-group-headers=X-Remote-Group",
            "--requestheader-extra-headers-prefix=X-Remote-Extra-",
            "--enable-admission-plugins=NodeRestriction",
            "--allow-privileged=true",
            f"--service-cluster-ip-range={SERVICE_CIDR}",
            # Endpoints may not hold loopback addresses, so the "kubernetes" Service gets none.
            "--endpoint-reconciler-type=none",
            "--profiling=false",
            *self._common_kube_flags(),
        ]
        if DEFAULT_RUNTIME_CONFIG:
            flags.append(f"--runtime-config={','.join(DEFAULT_RUNTIME_CONFIG)}")
        return flags

    def _client_component_flags(self, who: str, port: int) -> list[str]:
        kubeconfig = self._state_dir / f"{who}.kubeconfig"
        return [
            f"--kubeconfig={kubeconfig}",
            f"--authentication-kubeconfig={kubeconfig}",
            f"--authorization-kubeconfig={kubeconfig}",
            "--leader-elect=false",
            "--bind-address=127.0.0.1",
            f"--secure-port={port}",
            f"--cert-dir={self._state_dir / (who + '-certs')}",
            *self._common_kube_flags(),
        ]

    def _scheduler_argv(self, ports: tuple[int, ...]) -> list[str]:
        return self._client_component_flags("scheduler", ports[0])

    def _controller_manager_argv(self, ports: tuple[int, ...]) -> list[str]:
        pki = self.pki
        return [
            *self._client_component_flags("controller-manager", ports[0]),
            "--controllers=" + ",".join(["*", *(f"-{c}" for c in DISABLED_CONTROLLERS)]),
            "--use-service-account-credentials=true",
            f"--root-ca-file={pki.ca_cert}",
            f"--service-account-private-key-file={pki.sa_key}",
            f"--cluster-signing-cert-file={pki.ca_cert}",
            f"--cluster-signing-key-file={pki.ca_key}",
        ]

    # ---- internals: health checks

    def _etcd_ready(self, comp: _Component) -> bool:
        status, body = _http_get("http", comp.ports[0], "/health", None)
        if status != 200:
            return False
        with contextlib.suppress(ValueError, AttributeError):
            return str(json.loads(body).get("health")) == "true"
        return False

    def _apiserver_ready(self, comp: _Component) -> bool:
        cert, key = self.pki.client("admin")
        ctx = ssl.create_default_context(cafile=str(self.ca_cert))
        ctx.load_cert_chain(str(cert), str(key))
        status, _ = _http_get("https", comp.ports[0], "/readyz", ctx)
        return status == 200

    def _component_healthy(self, comp: _Component) -> bool:
        # kube-scheduler and kube-controller-manager serve a self-signed certificate.
        ctx = ssl.create_default_context()
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
        status, _ = _http_get("https", comp.ports[0], "/healthz", ctx)
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
