"""The real container runtime of a rig node (dev-only): containerd 2.x + runc under the real kubelet.

``KubeletNode(..., runtime="containerd")`` runs the node's kubelet and containerd in one private mount namespace
and one network namespace of their own, held by a ``sleep`` process (the *holder*), so nothing on the machine
changes and several nodes run side by side:

- mounts: ``<node>/var-lib`` on ``/var/lib`` (so the kubelet's ``--root-dir`` is the usual ``/var/lib/kubelet``
  and the charts' default host paths are right), ``<node>/var-log`` on ``/var/log``, ``<node>/run`` on ``/run``
  (containerd's state, the shims' sockets, ``/var/run/cdi``), files over the ``/proc/sys`` entries the kubelet
  writes, and an overlay on ``/dev`` (the machine's ``/dev`` below, ``<node>/dev-upper`` above) where the fake
  host's device nodes are created with the major:minor of its sysfs ``dev`` files;
- the fake host tree (``<node>/host``) also at :data:`FAKE_HOST_IN_NODE`, the same path on every node, so one
  ``fakeHost.path`` serves a whole cluster;
- network: loopback up, the node's address, the ``kubernetes`` Service's ClusterIP and the cluster DNS address
  (:data:`~accel_rig.clusterdns.DNS_IP`) on ``lo``, the whole Service range routed to ``lo`` as local
  (any ClusterIP can be bound there); :mod:`accel_rig.nodeservices` answers DNS and forwards every
  Service's ClusterIP ports to its ready endpoints (on this node or another); a forwarder
  (:mod:`accel_rig.netnsproxy`) carries the ClusterIP and the API server's own address to the machine's
  loopback, another one serves the kubelet's port on the node's own machine-loopback address (127.0.0.N, see
  :mod:`accel_rig.noderoutes`); pods get a veth pair between their namespace and the node's
  (``rig/accel_rig/data/accel-veth``, addresses 10.(88+slot).x.y), nothing else; the node's route file tells the API
  server's egress proxy (:mod:`accel_rig.egressproxy`) how to reach the kubelet and the pods;
- images: the pause, busybox (also under the examples' busybox reference), kube-scheduler and project OCI archives
  made by ``scripts/build-images.sh``, imported with ``ctr`` before the kubelet starts (``imagePullPolicy: Never``
  and ``IfNotPresent`` both find them; nothing is pulled).

The binaries come from ``scripts/build-runtime.sh`` (containerd, its runc shim and ctr from the Go module proxy;
runc from Debian). Facts behind each setting: ``/work/shared/reference/real-runtime.md`` of the project.
"""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import shutil
import subprocess
import sys
import time
import zlib
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import psutil

from accel_core.hostfiles import HostValueError, parse_int, read_attr
from accel_rig.clusterdns import DNS_IP
from accel_rig.controlplane_errors import ControlPlaneError
from accel_rig.controlplane_pki import SERVICE_CIDR, SERVICE_IP
from accel_rig.controlplane_processes import (
    process_start_ticks,
    spawn_logged,
    tail_file,
    terminate_processes,
)
from accel_rig.kubeversions import cache_root
from accel_rig.noderoutes import NodeRoute, loopback_ip, pod_prefix, save_route

CONTAINERD_VERSION = "v2.4.2"
RUNTIME = "containerd"
FAKECRI_RUNTIME = "fakecri"
RUNTIMES = (FAKECRI_RUNTIME, RUNTIME)
PAUSE_IMAGE = "example.local/pause:3.10"
BUSYBOX_IMAGE = "example.local/busybox:1.35"
#: Where every containerd node has its fake host tree in its own mount namespace (``fakeHost.path`` of the charts).
FAKE_HOST_IN_NODE = "/var/lib/accel-fake-host"
#: The misc-class major of ``/dev/infiniband/rdma_cm`` (its minor is dynamic on real hosts; any is fine here).
RDMA_CM_DEV = "10:58"
CNI_PLUGIN = Path(__file__).resolve().parent / "data" / "accel-veth"  # package data: found installed or checked out


@dataclass(frozen=True)
class ServiceAccess:
    """How a node's :mod:`~accel_rig.nodeservices` lists Services: the API server and a client
    certificate (``system:kube-proxy``)."""

    server: str
    ca: Path
    cert: Path
    key: Path


@dataclass(frozen=True)
class RuntimeBinaries:
    """Where ``scripts/build-runtime.sh`` and ``scripts/build-images.sh`` put their outputs."""

    root: Path
    images: Path

    @classmethod
    def default(cls) -> RuntimeBinaries:
        return cls(cache_root("runtime", "ACCEL_RUNTIME_CACHE") / f"containerd{CONTAINERD_VERSION}",
                   cache_root("images", "ACCEL_IMAGE_CACHE"))

    @property
    def bin(self) -> Path:
        return self.root / "bin"

    @property
    def runc(self) -> Path:
        return self.root / "debroot" / "usr" / "bin" / "runc"

    @property
    def ctr(self) -> Path:
        return self.bin / "ctr"

    def image_archives(self) -> list[Path]:
        """Pause and busybox first (the sandbox image must be there before any pod), then kube-scheduler (the neuron
        chart's my-scheduler) and the project image when built."""
        out = [self.images / "pause.oci.tar", self.images / "busybox.oci.tar"]
        optional = [self.images / "kube-scheduler.oci.tar", self.images / "app-current" / "image.oci.tar"]
        return out + [p for p in optional if p.is_file()]

    def missing(self) -> list[str]:
        """What is not built yet, each named with the script that builds it."""
        out = [f"{p} (scripts/build-runtime.sh)" for p in
               (self.bin / "containerd", self.bin / "containerd-shim-runc-v2", self.ctr, self.runc)
               if not p.is_file()]
        out += [f"{p} (scripts/build-images.sh)" for p in self.image_archives()[:2] if not p.is_file()]
        for tool in ("unshare", "nsenter", "mount", "ip"):
            if shutil.which(tool) is None:
                out.append(f"`{tool}` on PATH (util-linux / iproute2)")
        return out

    def app_image_built(self) -> bool:
        return (self.images / "app-current" / "image.oci.tar").is_file()


def node_ip(name: str) -> str:
    """The node's own address in its namespace (10.201.x.y, stable per name; namespaces keep nodes apart)."""
    h = zlib.crc32(name.encode())
    return f"10.201.{(h >> 8) % 250 + 1}.{h % 250 + 2}"


def device_nodes(host_root: Path) -> list[tuple[str, str]]:
    """``(path under /dev, "major:minor")`` for every device file of a fake host, with the numbers of the sysfs class
    entry of the same name (``sys/class/<class>/<name>/dev``, as udev names device nodes), whatever the accelerator;
    ``/dev/infiniband/rdma_cm``, a misc device with no class entry in the fake host, gets a misc node. A device whose
    ``dev`` file is missing or malformed is left out (its daemon reports it)."""
    class_dev = {entry.name: entry / "dev" for entry in (host_root / "sys" / "class").glob("*/*")}
    out: list[tuple[str, str]] = []
    dev = host_root / "dev"
    for path in sorted(p for p in dev.rglob("*") if p.is_file() and not p.is_symlink()):
        rel = path.relative_to(dev).as_posix()
        where = class_dev.get(path.name)
        if where is None:
            if rel == "infiniband/rdma_cm":
                out.append((f"/dev/{rel}", RDMA_CM_DEV))
            continue
        try:
            major, sep, minor = read_attr(str(where)).partition(":")
            if sep:
                out.append((f"/dev/{rel}", f"{parse_int(major, str(where))}:{parse_int(minor, str(where))}"))
        except HostValueError:
            continue
    return out


def containerd_config(node_dir: Path, bins: RuntimeBinaries) -> str:
    """containerd's config (version 3): its own root/state/socket (under the namespace's /var/lib and /run), the
    overlayfs snapshotter, the local pause image, CDI specs from ``/var/run/cdi`` (CDI is always on in 2.x),
    ``restrict_oom_score_adj`` (this VM's root lacks CAP_SYS_RESOURCE, so a negative OOM score fails every
    sandbox), runc from the Debian package with cgroupfs, and the rig's CNI plugin (containerd brings up the pods'
    loopback itself, so no upstream CNI plugin binary is needed)."""
    q = _toml_str
    return f"""version = 3
root = "/var/lib/containerd"
state = "/run/containerd"

[grpc]
  address = "/run/containerd/containerd.sock"

[plugins."io.containerd.cri.v1.images"]
  snapshotter = "overlayfs"
  [plugins."io.containerd.cri.v1.images".pinned_images]
    sandbox = {q(PAUSE_IMAGE)}

[plugins."io.containerd.cri.v1.runtime"]
  cdi_spec_dirs = ["/var/run/cdi", "/etc/cdi"]
  restrict_oom_score_adj = true
  netns_mounts_under_state_dir = true
  [plugins."io.containerd.cri.v1.runtime".containerd]
    default_runtime_name = "runc"
    [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc.options]
        BinaryName = {q(str(bins.runc))}
        SystemdCgroup = false
  [plugins."io.containerd.cri.v1.runtime".cni]
    bin_dirs = [{q(str(node_dir / "cni" / "bin"))}]
    conf_dir = {q(str(node_dir / "cni" / "net.d"))}
    max_conf_num = 1
    use_internal_loopback = true
"""


def _toml_str(value: str) -> str:
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


class ContainerdRuntime:
    """The holder, the API forwarder and containerd of one node; the kubelet is started by :class:`KubeletNode`
    through :meth:`enter`."""

    HOLDER = "netns-holder"
    PROXY = "api-forwarder"
    KUBELET_PROXY = "kubelet-forwarder"
    SERVICES = "node-services"
    CONTAINERD = "containerd"

    def __init__(self, name: str, node_dir: Path, *, api_port: int, bins: RuntimeBinaries, detach: bool,
                 sysctl_binds: Iterable[tuple[Path, str]], host_root: Path, slot: int = 0, kubelet_port: int = 0,
                 routes_dir: Path | None = None, services: ServiceAccess | None = None) -> None:
        self.name = name
        self.services = services
        self.dir = node_dir
        self.api_port = api_port
        self.slot = slot
        self.kubelet_port = kubelet_port
        self.routes_dir = routes_dir
        self.bins = bins
        self.detach = detach
        self.ip = node_ip(name)
        self.host_root = host_root
        self._sysctl_binds = list(sysctl_binds)
        self.procs: dict[str, subprocess.Popen[bytes]] = {}

    # ---- paths

    @property
    def socket(self) -> Path:
        """containerd's socket as seen from outside the namespace."""
        return self.dir / "run" / "containerd" / "containerd.sock"

    @property
    def log_dir(self) -> Path:
        return self.dir / "logs"

    def log(self, name: str) -> Path:
        return self.log_dir / f"{name}.log"

    @property
    def holder_pid(self) -> int:
        return self.procs[self.HOLDER].pid

    @property
    def loopback(self) -> str:
        """The node's address on the machine's loopback, where its kubelet port is served."""
        return loopback_ip(self.slot)

    def enter(self, argv: Sequence[str]) -> list[str]:
        """``argv`` run inside the node's mount and network namespaces."""
        return ["nsenter", f"--target={self.holder_pid}", "--mount", "--net", "--", *argv]

    # ---- life cycle

    def start(self) -> None:
        missing = self.bins.missing()
        if missing:
            raise ControlPlaneError("the containerd runtime is not built: missing " + "; ".join(missing))
        for sub in ("run", "var-lib", "var-lib/accel-fake-host", "var-log", "dev-upper", "dev-work", "dev-keep/pts",
                    "dev-keep/shm", "cni/bin", "cni/net.d", "cni/state", "logs"):
            (self.dir / sub).mkdir(parents=True, exist_ok=True)
        self._write_cni()
        (self.dir / "containerd.toml").write_text(containerd_config(self.dir, self.bins))
        self._start_holder()
        self._make_device_nodes()
        self._start_proxy()
        self._start_kubelet_proxy()
        self._start_services()
        self._start_containerd()
        self._import_images()

    def _spawn(self, name: str, cmd: Sequence[str]) -> subprocess.Popen[bytes]:
        cwd = self.dir / "kubelet-cwd"
        cwd.mkdir(exist_ok=True)
        proc, _ = spawn_logged(cmd, self.log(name), cwd=cwd, detach=self.detach)
        self.procs[name] = proc
        return proc

    def _holder_script(self) -> str:
        q = shlex.quote
        d = self.dir
        lines = [
            "set -e",
            "ip link set lo up",
            f"ip addr add {self.ip}/32 dev lo",
            f"ip addr add {SERVICE_IP}/32 dev lo",
            f"ip addr add {DNS_IP}/32 dev lo",
            f"ip route add local {SERVICE_CIDR} dev lo",
            f"mount --bind {q(str(d / 'var-lib'))} /var/lib",
            f"mount --bind {q(str(self.host_root))} {q(FAKE_HOST_IN_NODE)}",
            f"mount --bind {q(str(d / 'var-log'))} /var/log",
            f"mount --bind {q(str(d / 'run'))} /run",
        ]
        lines += [f"mount --bind {q(str(src))} /proc/sys/{entry}" for src, entry in self._sysctl_binds]
        keep = d / "dev-keep"
        lines += [
            f"mount --rbind /dev/pts {q(str(keep / 'pts'))}",
            f"mount --rbind /dev/shm {q(str(keep / 'shm'))}",
            f"mount -t overlay overlay -o lowerdir=/dev,upperdir={q(str(d / 'dev-upper'))},"
            f"workdir={q(str(d / 'dev-work'))} /dev",
            f"mount --move {q(str(keep / 'pts'))} /dev/pts",
            f"mount --move {q(str(keep / 'shm'))} /dev/shm",
            f"touch {q(str(d / 'run' / 'node-namespace-ready'))}",
            "exec sleep infinity",
        ]
        return "\n".join(lines)

    def _start_holder(self) -> None:
        # /run is cleared as a boot clears it (containerd's state, shim sockets, CDI specs of the last boot).
        run = self.dir / "run"
        shutil.rmtree(run, ignore_errors=True)
        run.mkdir()
        proc = self._spawn(self.HOLDER, ["unshare", "--mount", "--net", "--propagation", "private", "--",
                                         "/bin/sh", "-c", self._holder_script()])
        ready = run / "node-namespace-ready"  # the namespace's /run is this directory
        self._wait(ready.exists, proc, self.HOLDER, 20)

    def _make_device_nodes(self) -> None:
        nodes = device_nodes(self.host_root)
        if not nodes:
            return
        script = ["set -e"]
        for path, majmin in nodes:
            major, minor = majmin.split(":")
            script += [f"mkdir -p {shlex.quote(os.path.dirname(path))}",
                       f"[ -e {shlex.quote(path)} ] || mknod -m 0666 {shlex.quote(path)} c {major} {minor}"]
        subprocess.run(self.enter(["/bin/sh", "-c", "\n".join(script)]), check=True, timeout=30,
                       capture_output=True)

    def _start_proxy(self) -> None:
        self._spawn(self.PROXY, [sys.executable, "-m", "accel_rig.netnsproxy",
                                 f"--netns=/proc/{self.holder_pid}/ns/net", f"--listen={SERVICE_IP}:443",
                                 f"--listen=127.0.0.1:{self.api_port}", f"--to=127.0.0.1:{self.api_port}",
                                 f"--holder={self.holder_pid}"])
        log = self.log(self.PROXY)
        self._wait(lambda: "netnsproxy: " in tail_file(log, 3), self.procs[self.PROXY], self.PROXY, 20)

    def _start_kubelet_proxy(self) -> None:
        """The kubelet's port on 127.0.0.N of the machine, and the route file of the node."""
        if not self.kubelet_port:
            return
        self._spawn(self.KUBELET_PROXY, [sys.executable, "-m", "accel_rig.netnsproxy", "--into",
                                         f"--netns=/proc/{self.holder_pid}/ns/net",
                                         f"--listen={self.loopback}:{self.kubelet_port}",
                                         f"--to={self.ip}:{self.kubelet_port}", f"--holder={self.holder_pid}"])
        log = self.log(self.KUBELET_PROXY)
        self._wait(lambda: "netnsproxy: " in tail_file(log, 3), self.procs[self.KUBELET_PROXY], self.KUBELET_PROXY,
                   20)
        if self.routes_dir is not None:
            ticks = process_start_ticks(self.holder_pid)
            save_route(self.routes_dir, NodeRoute(self.name, self.slot, self.ip, self.kubelet_port, self.holder_pid,
                                                  -1 if ticks is None else ticks))

    def _start_services(self) -> None:
        """Cluster DNS and the Services' ClusterIPs in the node (needs the route files of the nodes)."""
        if self.services is None or self.routes_dir is None:
            return
        s = self.services
        self._spawn(self.SERVICES, [sys.executable, "-m", "accel_rig.nodeservices",
                                    f"--netns=/proc/{self.holder_pid}/ns/net", f"--holder={self.holder_pid}",
                                    f"--routes={self.routes_dir}", f"--server={s.server}", f"--ca={s.ca}",
                                    f"--cert={s.cert}", f"--key={s.key}"])
        log = self.log(self.SERVICES)
        self._wait(lambda: "nodeservices: DNS on" in tail_file(log, 50), self.procs[self.SERVICES], self.SERVICES,
                   30)

    def _start_containerd(self) -> None:
        self.socket.unlink(missing_ok=True)
        path = f"{self.bins.bin}:{self.bins.runc.parent}:{os.environ.get('PATH', '/usr/sbin:/usr/bin:/sbin:/bin')}"
        proc = self._spawn(self.CONTAINERD, self.enter(
            ["env", f"PATH={path}", str(self.bins.bin / "containerd"), "--config", str(self.dir / "containerd.toml")]))
        self._wait(self.socket.exists, proc, self.CONTAINERD, 30)

    def ctr(self, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        return ctr(self.bins, self.socket, *args, timeout=timeout)

    def _import_images(self) -> None:
        for archive in self.bins.image_archives():
            out = self.ctr("images", "import", "--local", str(archive), timeout=300)
            if out.returncode != 0:
                raise ControlPlaneError(f"node {self.name}: ctr images import {archive} failed:\n{out.stderr[-2000:]}")

    def images(self) -> list[str]:
        out = self.ctr("images", "list", "--quiet")
        return out.stdout.split() if out.returncode == 0 else []

    def _wait(self, ready: Callable[[], bool], proc: subprocess.Popen[bytes], name: str, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while not ready():
            if proc.poll() is not None or time.monotonic() > deadline:
                raise ControlPlaneError(f"node {self.name}: {name} did not start (log {self.log(name)}):\n"
                                        f"{tail_file(self.log(name), 30)}")
            time.sleep(0.05)

    def stop(self, timeout: float = 20.0) -> None:
        """Every container killed and deleted (their cgroups go with them), then containerd, the shims, the
        forwarder and the holder: the namespaces and their mounts die with the last process."""
        stop_namespace(self.dir, self.bins, holder=self.procs.get(self.HOLDER), timeout=timeout)
        for name in (self.CONTAINERD, self.SERVICES, self.KUBELET_PROXY, self.PROXY, self.HOLDER):
            proc = self.procs.pop(name, None)
            if proc is not None:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(timeout=5)

    def _write_cni(self) -> None:
        plugin = self.dir / "cni" / "bin" / "accel-veth"
        shutil.copyfile(CNI_PLUGIN, plugin)
        plugin.chmod(0o755)
        conf = {"cniVersion": "1.0.0", "name": "accel-rig",
                "plugins": [{"type": "accel-veth", "nodeIP": self.ip, "podPrefix": pod_prefix(self.slot),
                             "stateDir": str(self.dir / "cni" / "state")}]}
        (self.dir / "cni" / "net.d" / "10-accel-rig.conflist").write_text(json.dumps(conf) + "\n")


def ctr(bins: RuntimeBinaries, socket: Path, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """``ctr`` against a node's containerd, in the CRI's ``k8s.io`` namespace."""
    return subprocess.run([str(bins.ctr), "--address", str(socket), "--namespace", "k8s.io", *args],
                          capture_output=True, text=True, timeout=timeout, check=False)


def _mount_ns(pid: int) -> str | None:
    try:
        return os.readlink(f"/proc/{pid}/ns/mnt")
    except OSError:
        return None


def stop_namespace(node_dir: Path, bins: RuntimeBinaries, *, holder: subprocess.Popen[bytes] | psutil.Process | None,
                   timeout: float = 20.0) -> list[str]:
    """Stop a containerd node's runtime: kill and delete every task (containers, sandboxes) through containerd
    while it runs, then every process left in the node's mount namespace (containerd, shims), the forwarder and the
    holder. Return what was stopped."""
    stopped: list[str] = []
    sock = node_dir / "run" / "containerd" / "containerd.sock"
    if holder is not None and sock.exists():
        tasks = ctr(bins, sock, "tasks", "list", "--quiet", timeout=60).stdout.split()
        for task in tasks:
            ctr(bins, sock, "tasks", "kill", "--signal", "SIGKILL", task, timeout=60)
        for task in tasks:
            ctr(bins, sock, "tasks", "delete", "--force", task, timeout=60)
        stopped += [f"task/{t[:12]}" for t in tasks]
    holder_pid = holder.pid if holder is not None else None
    ns = _mount_ns(holder_pid) if holder_pid is not None else None
    if ns is not None:
        inside = [p for p in psutil.process_iter() if p.pid != holder_pid and _mount_ns(p.pid) == ns]
        for p in inside:
            with contextlib.suppress(psutil.Error):
                stopped.append(f"{p.name()}/{p.pid}")
        terminate_processes(inside, timeout)
    # the forwarders and node services exit by themselves once the holder is gone; the holder last
    ours = ("accel_rig.netnsproxy", "accel_rig.nodeservices")
    for p in psutil.process_iter(["cmdline"]):
        cmd = p.info.get("cmdline") or []
        if holder_pid is not None and any(m in cmd for m in ours) and f"--holder={holder_pid}" in cmd:
            terminate_processes([p], timeout)
    if holder_pid is not None:
        with contextlib.suppress(psutil.NoSuchProcess):
            terminate_processes([psutil.Process(holder_pid)], timeout)
    return stopped
