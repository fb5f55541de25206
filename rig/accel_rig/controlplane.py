"""Run the real Kubernetes control plane (etcd, kube-apiserver, kube-scheduler, kube-controller-manager) on
127.0.0.1 for tests and for people.

This module is the orchestration: start order, ports, processes and stop. The components' command lines are in
``controlplane_flags``, their readiness probes in ``controlplane_health``, the admin API in ``controlplane_api``.
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
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any

from accel_rig.controlplane_api import AdminApi, create_fake_node, mint_token
from accel_rig.controlplane_errors import ControlPlaneError, MissingBinariesError
from accel_rig.controlplane_flags import DEFAULT_FEATURE_GATES, ComponentFlags
from accel_rig.controlplane_health import apiserver_ready, component_healthy, etcd_ready
from accel_rig.controlplane_pki import (
    ADMIN_USER,
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
        self._feature_gates = {**DEFAULT_FEATURE_GATES, **(feature_gates or {})}
        self._extra_args = {k: list(v) for k, v in (extra_args or {}).items()}
        unknown = set(self._extra_args) - set(COMPONENTS)
        if unknown:
            raise ValueError(f"extra_args for unknown components {sorted(unknown)}; known: {COMPONENTS}")
        self._flags = ComponentFlags(self._state_dir, verbosity, self._feature_gates, etcd_fsync)
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
            self._launch(ETCD, 2, self._flags.etcd, lambda c: etcd_ready(c.ports[0]))
            self._start_egress_proxy()
            self._launch(APISERVER, 1, lambda ports: self._flags.apiserver(ports, self.etcd_url),
                         lambda c: apiserver_ready(c.ports[0], self.pki))
            self._write_kubeconfigs()
            if self.with_scheduler:
                self._launch(SCHEDULER, 1, self._flags.scheduler, lambda c: component_healthy(c.ports[0]))
            if self.with_controller_manager:
                self._launch(CONTROLLER_MANAGER, 1, self._flags.controller_manager,
                             lambda c: component_healthy(c.ports[0]))
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
        """A service-account token from the TokenRequest API (see :func:`controlplane_api.mint_token`)."""
        return mint_token(self.admin_api(), namespace, service_account, audiences, bound_pod=bound_pod,
                          bound_node=bound_node, expiration_seconds=expiration_seconds)

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
        """A Node the scheduler accepts although no kubelet runs behind it (see
        :func:`controlplane_api.create_fake_node`)."""
        return create_fake_node(self.admin_api(), name, cpu=cpu, memory=memory, pods=pods, labels=labels)

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
