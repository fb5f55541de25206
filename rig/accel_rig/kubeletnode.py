"""A real kubelet node on this machine for tests, the dev cluster and the demo: the upstream ``kubelet`` (built by
``scripts/build-kube.sh``) registered as a Node of a running control plane, with ``fakecri`` (``tools/fakecri``) as its
container runtime. Nothing runs in the "containers": the fake runtime only records, as JSON lines, what each
sandbox and container would get (devices, mounts, env, CDI device names), so tests can check the kubelet's work.

The kubelet runs as root in a private mount namespace (``unshare --mount``), so it changes nothing on the machine:

- ``<node>/var-lib`` is mounted over ``/var/lib`` and ``<node>/var-log`` over ``/var/log``: the kubelet's fixed
  device-plugins directory (``/var/lib/kubelet/device-plugins``) is ``<node>/var-lib/kubelet/device-plugins``
  outside, and pod logs stay in the node directory;
- the few ``/proc/sys`` entries the kubelet sets (overcommit, panic, keys) are files of the node directory mounted
  over the real ones, so the machine's sysctls never change;
- its ``--root-dir`` is ``<node>/kubelet``, the same path inside and outside, so the plugin registration and DRA
  sockets have one path for the kubelet and the daemons, as on a real node. That the device-plugins directory is
  elsewhere is deliberate: it is what a relocated ``--root-dir`` looks like on a real node.

Loopback only: ``--node-ip 127.0.0.1`` and free ports for the kubelet's API and healthz. Everything is removed with
the processes; ``stop()`` leaves the machine as it found it (the mounts die with the namespace).
"""

from __future__ import annotations

import contextlib
import datetime
import shutil
import socket
import subprocess
import time
import urllib.parse
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import psutil
import yaml
from lightkube import Client
from lightkube.resources.core_v1 import Node
from lightkube.types import PatchType

from accel_rig.containerdnode import (
    ContainerdRuntime,
    RuntimeBinaries,
    ServiceAccess,
    stop_namespace,
)
from accel_rig.controlplane_api import AdminApi
from accel_rig.controlplane_errors import ApiRequestError, ControlPlaneError
from accel_rig.controlplane_pki import Pki, issue_client_cert, write_kubeconfig
from accel_rig.controlplane_processes import (
    ProcessRecord,
    recorded_process,
    spawn_logged,
    tail_file,
    terminate_processes,
)
from accel_rig.fakecrirecords import ContainerRecord, container_records, read_cri_records
from accel_rig.kubeletconfig import (
    KUBELET_FEATURE_GATES,
    KUBELET_SYSCTLS,
    kubelet_configuration,
    namespace_script,
    write_sysctl_files,
)
from accel_rig.nodelayout import CONTAINERD, FAKECRI, KUBELET, NodeLayout, NodeRecord
from accel_rig.noderoutes import ROUTES_DIR, claim_slot, loopback_ip
from accel_rig.podlogs import pod_log_lines

INSTANCE_TYPE_LABEL = "node.kubernetes.io/instance-type"
NOT_READY_TAINT = "node.kubernetes.io/not-ready"


def _timestamp(text: Any) -> float:
    """Seconds since the epoch of an API timestamp (``2026-12-02T10:00:00Z``), 0 when absent or malformed."""
    try:
        return datetime.datetime.strptime(str(text), "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=datetime.UTC).timestamp()
    except ValueError:
        return 0.0


def _free_ports(count: int, host: str = "127.0.0.1") -> tuple[int, ...]:
    held = []
    try:
        for _ in range(count):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind((host, 0))
            held.append(s)
        return tuple(int(s.getsockname()[1]) for s in held)
    finally:
        for s in held:
            s.close()


class KubeletNode:
    """One real kubelet (and its fakecri) registered as Node ``name`` with the API server ``server``.

    ``node_dir`` holds everything (see :class:`NodeLayout`); the fake host tree must already be in
    ``layout.host_root`` if daemons are to find devices (the cluster tool and the fixtures build it).
    """

    def __init__(
        self,
        name: str,
        node_dir: Path,
        *,
        server: str,
        pki: Pki,
        bin_dir: Path,
        instance_type: str = "",
        host_options: Mapping[str, Any] | None = None,
        detach: bool = False,
        verbosity: int = 0,
        cert_days: int = 30,
        feature_gates: Mapping[str, bool] | None = None,
        extra_args: Sequence[str] = (),
        runtime: str = FAKECRI,
        routes_dir: Path | None = None,
    ) -> None:
        if runtime not in (FAKECRI, CONTAINERD):
            raise ControlPlaneError(f"node {name}: unknown runtime {runtime!r} (fakecri or containerd)")
        self.name = name
        self.runtime = runtime
        self.layout = NodeLayout(Path(node_dir).resolve(), runtime)
        self._containerd: ContainerdRuntime | None = None
        #: Where a containerd node writes its route file for the API server's egress proxy.
        self.routes_dir = routes_dir if routes_dir is not None else pki.dir.parent / ROUTES_DIR
        self.slot = 0
        self.server = server
        self.pki = pki
        self.bin_dir = Path(bin_dir)
        self.instance_type = instance_type
        #: the options its fake host was built with (recorded, so ``accel-cluster up`` can build it again)
        self.host_options = dict(host_options or {})
        self._detach = detach
        self._verbosity = verbosity
        self._cert_days = cert_days
        self._feature_gates = {**KUBELET_FEATURE_GATES, **(feature_gates or {})}
        self._extra_args = list(extra_args)
        self._procs: dict[str, subprocess.Popen[bytes]] = {}
        self._offsets: dict[str, int] = {}
        self.ports: tuple[int, ...] = ()
        #: Seconds from ``start()`` to the Node being Ready (set by ``wait_ready``).
        self.ready_seconds: float | None = None
        self._t0 = 0.0
        self._started_wall = 0.0

    # ---- files

    @property
    def kubelet_log(self) -> Path:
        return self.layout.log_dir / "kubelet.log"

    @property
    def fakecri_log(self) -> Path:
        return self.layout.log_dir / "fakecri.log"

    def device_plugin_registrations(self, resource: str) -> int:
        """How often the running kubelet accepted a Register of ``resource``: its own log line, counted after the
        header line this rig writes when it starts a kubelet (so an earlier kubelet run's lines do not count)."""
        text = self.kubelet_log.read_text(errors="replace").rpartition("\n--- ")[2]
        return text.count(f'"Got registration request from device plugin with resource" resourceName="{resource}"')

    def daemon_env(self, kubeconfig: Path) -> dict[str, str]:
        return self.layout.daemon_env(self.name, kubeconfig)

    def cri_records(self) -> Iterator[dict[str, Any]]:
        """Every call fakecri recorded so far (a partly written last line is skipped)."""
        return read_cri_records(self.layout.cri_record)

    def containers(self, pod: str | None = None, namespace: str | None = None) -> list[ContainerRecord]:
        """CreateContainer records, optionally of one pod."""
        return [c for c in container_records(self.cri_records())
                if (pod is None or c.pod == pod) and (namespace is None or c.namespace == namespace)]

    def logs_tail(self, lines: int = 40) -> str:
        return "\n\n".join(f"==> {p} <==\n{tail_file(p, lines)}" for p in (self.kubelet_log, self.fakecri_log)
                           if p.exists())

    # ---- life cycle

    def start(self) -> KubeletNode:
        """Write credentials and config, start fakecri, then the kubelet. Does not wait for Ready."""
        for tool in ("unshare", "mount"):
            if shutil.which(tool) is None:
                raise ControlPlaneError(f"`{tool}` (util-linux) is needed to run a kubelet node")
        missing = [b for b in (KUBELET, FAKECRI) if not (self.bin_dir / b).is_file()
                   and (b == KUBELET or self.runtime == FAKECRI)]
        if missing:
            raise ControlPlaneError(f"missing {', '.join(missing)} in {self.bin_dir}; run scripts/build-kube.sh")
        self._refuse_if_running()
        self._t0 = time.monotonic()
        self._started_wall = time.time()
        self.ready_seconds = None
        lay = self.layout
        for d in (lay.kubelet_root, lay.device_plugins_dir, lay.var_log, lay.cdi_root, lay.proc_sys, lay.log_dir):
            d.mkdir(parents=True, exist_ok=True)
        self._write_credentials()
        write_sysctl_files(self.layout.proc_sys)
        if self.runtime == CONTAINERD:
            self.slot = claim_slot(self.routes_dir, self.name)
            self.ports = _free_ports(2, loopback_ip(self.slot))
        else:
            self.ports = _free_ports(2)
        self._write_config()
        try:
            if self.runtime == CONTAINERD:
                self._start_containerd()
            else:
                self._start_fakecri()
            self._start_kubelet()
        except BaseException:
            self.stop()
            raise
        self._save_record()
        return self

    def stop(self, timeout: float = 20.0) -> None:
        """Stop the kubelet, then the runtime (SIGTERM, then SIGKILL): with containerd every container is killed
        and deleted first and the node's namespaces go with their last process. The node's files stay."""
        if self._containerd is not None:
            self.stop_kubelet(timeout)
            self._containerd.stop(timeout)
            self._containerd = None
        for name in (KUBELET, FAKECRI):
            proc = self._procs.pop(name, None)
            if proc is not None and proc.poll() is None:
                terminate_processes([psutil.Process(proc.pid)], timeout)
            if proc is not None:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(timeout=5)
        self._save_record()

    def stop_kubelet(self, timeout: float = 20.0) -> None:
        """Stop only the kubelet (its pods' records stay with fakecri)."""
        proc = self._procs.pop(KUBELET, None)
        if proc is not None and proc.poll() is None:
            terminate_processes([psutil.Process(proc.pid)], timeout)
            proc.wait(timeout=5)
        self._save_record()

    def restart_kubelet(self) -> None:
        """Stop and start the kubelet alone, as ``systemctl restart kubelet`` would; fakecri keeps its state."""
        self.stop_kubelet()
        self._t0 = time.monotonic()
        self._started_wall = time.time()
        self.ready_seconds = None
        self._start_kubelet()
        self._save_record()

    def reboot(self, timeout: float = 120.0) -> None:
        """Everything of the node stopped (containers too, with containerd) and started again on the same files,
        as after a reboot: the kubelet re-creates the pods the API server still binds to the node."""
        self.stop()
        self.start()
        self.wait_ready(timeout)

    def pod_log(self, namespace: str, pod: str, container: str) -> str:
        """What a container of ``namespace/pod`` wrote (all its restarts, oldest first), from the node's
        ``/var/log/pods`` in the CRI log format, without the timestamp/stream/tag prefix of each line."""
        return "".join(pod_log_lines(self.layout.pod_logs, namespace, pod, container))

    @property
    def containerd(self) -> ContainerdRuntime:
        if self._containerd is None:
            raise ControlPlaneError(f"node {self.name} does not run containerd")
        return self._containerd

    def kubelet_running(self) -> bool:
        proc = self._procs.get(KUBELET)
        return proc is not None and proc.poll() is None

    def wait_ready(self, timeout: float = 120.0, api: AdminApi | None = None) -> dict[str, Any]:
        """Wait until the Node is Ready with no ``node.kubernetes.io/not-ready`` taint; return it."""
        api = api or AdminApi(self.server, self.pki)
        with contextlib.closing(api.client()) as client:
            return self._wait_ready(api, client, timeout)

    def _wait_ready(self, api: AdminApi, client: Client, timeout: float) -> dict[str, Any]:
        started_wall = int(self._started_wall)  # a Ready left by an earlier kubelet run does not count
        deadline = time.monotonic() + timeout
        last = "no Node object yet"
        while time.monotonic() < deadline:
            for name, proc in self._procs.items():
                if proc.poll() is not None:
                    log = self.kubelet_log if name == KUBELET else self.fakecri_log
                    raise ControlPlaneError(f"{name} of node {self.name} exited with code {proc.returncode} "
                                            f"(log {log}):\n{tail_file(log, 40)}")
            node: dict[str, Any] | None = None
            try:
                with api.errors(f"GET node {self.name}"):
                    node = client.get(Node, self.name).to_dict()
            except ApiRequestError as e:
                last = str(e)
            if node is not None:
                ready = [c for c in node.get("status", {}).get("conditions", []) if c.get("type") == "Ready"
                         and _timestamp(c.get("lastHeartbeatTime")) >= started_wall]
                taints = [t.get("key") for t in node.get("spec", {}).get("taints", []) or []]
                last = f"Ready={ready[0].get('status') if ready else None} taints={taints}"
                if ready and ready[0].get("status") == "True":
                    if NOT_READY_TAINT not in taints:
                        self.ready_seconds = time.monotonic() - self._t0
                        return node
                    self._lift_not_ready_taint(api, client, node)
            time.sleep(0.25)
        raise ControlPlaneError(f"node {self.name} not Ready within {timeout:.0f}s ({last}); kubelet log "
                                f"{self.kubelet_log}:\n{tail_file(self.kubelet_log, 30)}")

    def _lift_not_ready_taint(self, api: AdminApi, client: Client, node: dict[str, Any]) -> None:
        """Do the node-lifecycle controller's one job for this node: the kubelet registers the Node with the
        ``not-ready`` taint, and that controller (left out of this control plane, because it would taint the
        kubelet-less fake Nodes other tests make) lifts it once the kubelet reports Ready."""
        keep = [t for t in node.get("spec", {}).get("taints", []) or [] if t.get("key") != NOT_READY_TAINT]
        patch = {"metadata": {"resourceVersion": node["metadata"]["resourceVersion"]},
                 "spec": {"taints": keep or None}}
        with contextlib.suppress(ApiRequestError), api.errors(f"patch node {self.name}"):
            client.patch(Node, self.name, patch, patch_type=PatchType.MERGE)  # a conflict: the next poll tries again

    # ---- internals

    def _refuse_if_running(self) -> None:
        record = NodeRecord.load(self.layout.dir)
        if record is None:
            return
        live = [r.name for r in record.processes if recorded_process(r) is not None]
        if live:
            raise ControlPlaneError(f"node {self.name}: {', '.join(live)} still running from {self.layout.dir}")

    def _write_credentials(self) -> None:
        cert, key = self.layout.pki_dir / "node.crt", self.layout.pki_dir / "node.key"
        if not (cert.is_file() and key.is_file()):
            issue_client_cert(self.pki, self.layout.pki_dir, "node", f"/O=system:nodes/CN=system:node:{self.name}",
                              days=self._cert_days)
        write_kubeconfig(self.layout.kubeconfig, self.server, self.pki.ca_cert, f"system:node:{self.name}",
                         {"client-certificate": str(cert), "client-key": str(key)})
        if self.runtime == CONTAINERD and not (self.layout.pki_dir / "kube-proxy.key").is_file():
            # the node's Services view (nodeservices) reads as kube-proxy does: the default RBAC's node-proxier
            issue_client_cert(self.pki, self.layout.pki_dir, "kube-proxy", "/CN=system:kube-proxy",
                              days=self._cert_days)

    def _write_config(self) -> None:
        config = kubelet_configuration(self.layout, self.ports, self.pki.ca_cert, self._feature_gates)
        self.layout.config.write_text(yaml.safe_dump(config, sort_keys=False))

    def _start_fakecri(self) -> None:
        self.layout.cri_socket.unlink(missing_ok=True)
        cmd = [str(self.bin_dir / FAKECRI), "--listen", str(self.layout.cri_socket),
               "--record", str(self.layout.cri_record)]
        proc, self._offsets[FAKECRI] = spawn_logged(cmd, self.fakecri_log, cwd=self.layout.dir, detach=self._detach)
        self._procs[FAKECRI] = proc
        deadline = time.monotonic() + 20
        while not self.layout.cri_socket.exists():
            if proc.poll() is not None or time.monotonic() > deadline:
                raise ControlPlaneError(f"fakecri did not serve {self.layout.cri_socket} (log {self.fakecri_log}):\n"
                                        f"{tail_file(self.fakecri_log, 20)}")
            time.sleep(0.05)

    def _kubelet_argv(self) -> list[str]:
        labels = {"kubernetes.io/os": "linux"}
        if self.instance_type:
            labels[INSTANCE_TYPE_LABEL] = self.instance_type
        root = "/var/lib/kubelet" if self.runtime == CONTAINERD else str(self.layout.kubelet_root)
        node_ip = self._containerd.ip if self._containerd is not None else "127.0.0.1"
        return [
            str(self.bin_dir / KUBELET),
            f"--config={self.layout.config}",
            f"--kubeconfig={self.layout.kubeconfig}",
            f"--root-dir={root}",
            f"--cert-dir={root}/pki",
            f"--hostname-override={self.name}",
            f"--node-ip={node_ip}",
            "--node-labels=" + ",".join(f"{k}={v}" for k, v in labels.items()),
            f"--v={self._verbosity}",
            *self._extra_args,
        ]

    def _start_containerd(self) -> None:
        api_port = urllib.parse.urlsplit(self.server).port or 443
        sysctls = [(self.layout.proc_sys / e.replace("/", "."), e) for e in KUBELET_SYSCTLS]
        self._containerd = ContainerdRuntime(self.name, self.layout.dir, api_port=api_port,
                                             bins=RuntimeBinaries.default(), detach=self._detach,
                                             sysctl_binds=sysctls, host_root=self.layout.host_root,
                                             slot=self.slot, kubelet_port=self.ports[0], routes_dir=self.routes_dir,
                                             services=ServiceAccess(self.server, self.pki.ca_cert,
                                                                    self.layout.pki_dir / "kube-proxy.crt",
                                                                    self.layout.pki_dir / "kube-proxy.key"))
        try:
            self._containerd.start()
        finally:
            self._procs.update(self._containerd.procs)

    def _start_kubelet(self) -> None:
        if self._containerd is not None:
            cmd = self._containerd.enter(self._kubelet_argv())
        else:
            script = namespace_script(self.layout, self._kubelet_argv())
            cmd = ["unshare", "--mount", "--propagation", "private", "--", "/bin/sh", "-c", script]
        # An empty working directory of its own: the kubelet's container GC removes relative paths (a log path a
        # runtime left empty resolves to the cwd), which must never reach the node's files.
        cwd = self.layout.dir / "kubelet-cwd"
        cwd.mkdir(exist_ok=True)
        proc, self._offsets[KUBELET] = spawn_logged(cmd, self.kubelet_log, cwd=cwd, detach=self._detach)
        self._procs[KUBELET] = proc

    def _save_record(self) -> None:
        procs = []
        for name, proc in self._procs.items():
            if proc.poll() is not None:
                continue
            log = self.layout.log_dir / f"{name}.log"
            rec = ProcessRecord.of(name, proc.pid, str(log), self.ports if name == KUBELET else ())
            if rec is not None:
                procs.append(rec)
        loopback = loopback_ip(self.slot) if self.runtime == CONTAINERD else ""
        NodeRecord(self.name, self.instance_type, tuple(procs), self.ports, self.host_options,
                   self.runtime, loopback).save(self.layout.dir)


def stop_recorded_node(node_dir: Path, timeout: float = 20.0) -> list[str]:
    """Stop the processes ``node.json`` in ``node_dir`` names (kubelet first); return those that were running."""
    record = NodeRecord.load(node_dir)
    if record is None:
        return []
    stopped = []
    live_of = {r.name: p for r in record.processes if (p := recorded_process(r)) is not None}
    for name in (KUBELET, FAKECRI):
        if name in live_of:
            terminate_processes([live_of[name]], timeout)
            stopped.append(f"{name}/{record.name}")
    if record.runtime == CONTAINERD:
        holder = live_of.get(ContainerdRuntime.HOLDER)
        stop_namespace(node_dir, RuntimeBinaries.default(), holder=holder, timeout=timeout)
        stopped += [f"{name}/{record.name}" for name in (ContainerdRuntime.CONTAINERD, ContainerdRuntime.HOLDER)
                    if name in live_of]
    NodeRecord(record.name, record.instance_type, (), record.ports, record.host_options,
               record.runtime, record.loopback).save(node_dir)
    return stopped
