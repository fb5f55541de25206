"""Run the real Kubernetes control plane (etcd, kube-apiserver, kube-scheduler, kube-controller-manager) on
127.0.0.1 for tests and for people.

This module is the orchestration: start order, ports, command lines, readiness, stop, and the admin API helpers.
Everything lives in one state directory: ``pki/`` (certificates and kubeconfigs: ``controlplane_pki``), ``etcd/``
(data), ``logs/<component>.log``, the admin kubeconfig and ``cluster.json`` (ports and PIDs, read by ``accel-cluster
down``/``status``: ``controlplane_processes``). Binaries come from ``scripts/build-kube.sh`` (see ``kubeversions``).

Typical use::

    with ControlPlane() as cp:           # owns a temp dir, removed on exit
        token = cp.mint_token("default", "default")
        kubeconfig = cp.kubeconfig_for_token(token)
"""

from __future__ import annotations

import contextlib
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
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any

import httpx2
from lightkube import ApiError, Client, KubeConfig
from lightkube.config.models import Cluster, User
from lightkube.models.authentication_v1 import BoundObjectReference, TokenRequestSpec
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.core_v1 import Node, NodeStatus, Pod, ServiceAccountToken
from lightkube.types import PatchType

from accel_rig.controlplane_errors import ApiRequestError, ControlPlaneError, MissingBinariesError
from accel_rig.controlplane_pki import (
    ADMIN_USER,
    SERVICE_CIDR,
    Pki,
    cert_user,
    generate_pki,
    write_kubeconfig,
)
from accel_rig.controlplane_processes import (
    ClusterRecord,
    ProcessRecord,
    recorded_process,
    spawn_logged,
    tail_file,
    terminate_processes,
)
from accel_rig.kubeversions import KUBE_BINARIES, build_script, kube_bin_dir
from accel_rig.noderoutes import ROUTES_DIR

ETCD = "etcd"
APISERVER = "kube-apiserver"
SCHEDULER = "kube-scheduler"
CONTROLLER_MANAGER = "kube-controller-manager"
#: The API server's way into the containerd nodes' namespaces (``accel_rig.egressproxy``).
EGRESS_PROXY = "egress-proxy"
#: Start order; ``stop`` goes the other way.
COMPONENTS = (ETCD, APISERVER, SCHEDULER, CONTROLLER_MANAGER)

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

_PORT_CLASH = "address already in use"
_STOP_STAGES: tuple[tuple[str, ...], ...] = ((CONTROLLER_MANAGER, SCHEDULER), (APISERVER,), (EGRESS_PROXY, ETCD))


class _PortClash(Exception):
    """A component exited because one of its ports was taken meanwhile."""


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
    def routes_dir(self) -> Path:
        """Where containerd nodes leave their route files for the egress proxy (``noderoutes``)."""
        return self._state_dir / ROUTES_DIR

    @property
    def egress_socket(self) -> Path:
        return self._state_dir / "egress.sock"

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
            self._start_egress_proxy()
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
                parts.append(f"==> {path} <==\n{tail_file(path, lines)}")
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

    def _start_egress_proxy(self) -> None:
        """The Unix-socket CONNECT proxy the API server's egress selector names for its ``cluster`` traffic."""
        sock = self.egress_socket
        if len(str(sock).encode()) > 107:
            raise ControlPlaneError(f"{sock}: a Unix socket path is at most 107 bytes; use a shorter state directory")
        sock.unlink(missing_ok=True)
        self.routes_dir.mkdir(parents=True, exist_ok=True)
        self._write_egress_config()
        cmd = [sys.executable, "-m", "accel_rig.egressproxy", f"--socket={sock}",
               f"--routes={self.routes_dir}"]
        comp = self._spawn(EGRESS_PROXY, cmd, self.log_dir / f"{EGRESS_PROXY}.log", ())
        self._components[EGRESS_PROXY] = comp
        self._wait_ready(comp, lambda _c: sock.exists())
        self.startup_times[EGRESS_PROXY] = time.monotonic() - self._t0

    def _write_egress_config(self) -> None:
        config = {"apiVersion": "apiserver.k8s.io/v1beta1", "kind": "EgressSelectorConfiguration",
                  "egressSelections": [{"name": "cluster", "connection": {
                      "proxyProtocol": "HTTPConnect", "transport": {"uds": {"udsName": str(self.egress_socket)}}}}]}
        (self._state_dir / "egress-selector.json").write_text(json.dumps(config, indent=2) + "\n")

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
                    + tail_file(comp.log_path, 40)
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
            self.admin_kubeconfig, self.server, self.ca_cert, ADMIN_USER, cert_user(*self.pki.client("admin"))
        )
        for who in ("scheduler", "controller-manager"):
            write_kubeconfig(
                self._state_dir / f"{who}.kubeconfig", self.server, self.ca_cert, f"system:kube-{who}",
                cert_user(*self.pki.client(who)),
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
            # kubectl logs/exec/port-forward and the service/pod proxy: the kubelet trusts the cluster CA's admin
            # certificate, and every connection to a node or pod goes through the egress proxy (loopback only).
            f"--kubelet-client-certificate={pki.client('admin')[0]}",
            f"--kubelet-client-key={pki.client('admin')[1]}",
            f"--egress-selector-config-file={self._state_dir / 'egress-selector.json'}",
            # The node's address first: node proxy checks it is a global unicast IP (a name would need DNS).
            "--kubelet-preferred-address-types=InternalIP,Hostname,InternalDNS,ExternalDNS,ExternalIP",
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
