"""``accel-cluster`` with real kubelet nodes, as a person uses it: up with nodes, node-env for the daemons, status,
down; and the machine as it was before (no processes, no mounts, no /var/lib/kubelet, the same sysctls), also after
a start that fails."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil
import pytest
from lightkube import Client, KubeConfig, codecs
from lightkube.resources.core_v1 import Node, Pod, ServiceAccount

from accel_core.devtools.containerdnode import BUSYBOX_IMAGE
from accel_core.devtools.kubeletnode import KUBELET_SYSCTLS

REPO = Path(__file__).resolve().parents[2]


def cluster(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "accel_core.devtools.cluster", *args], capture_output=True,
                          text=True, timeout=300, env={**os.environ, "PYTHONPATH": str(REPO), **(env or {})},
                          check=False)


def machine_state(state_dir: Path) -> tuple[list[str], list[str], dict[str, str], bool]:
    """Processes and mounts that mention the state dir, the kubelet's sysctls, and whether /var/lib/kubelet exists."""
    procs = []
    for p in psutil.process_iter(["cmdline"]):
        cmd = " ".join(p.info["cmdline"] or [])
        if str(state_dir) in cmd:
            procs.append(cmd)
    mounts = [line for line in Path("/proc/self/mountinfo").read_text().splitlines() if str(state_dir) in line]
    sysctls = {s: (Path("/proc/sys") / s).read_text() for s in KUBELET_SYSCTLS}
    return procs, mounts, sysctls, Path("/var/lib/kubelet").exists()


def container_cgroups() -> set[Path]:
    """The containers' cgroups containerd made (directories under a ``k8s.io`` cgroup of the pids hierarchy); the
    ``k8s.io`` parent itself, made by the first container on a fresh machine and left empty, is not one."""
    return {p for p in Path("/sys/fs/cgroup/pids").glob("**/k8s.io/*") if p.is_dir()}


def test_up_with_nodes_node_env_and_down_leave_the_machine_as_it_was(kube_binaries: Path) -> None:
    base = Path(tempfile.mkdtemp(prefix="acl-", dir="/dev/shm" if os.access("/dev/shm", os.W_OK) else None))
    state = base / "cl"
    before = machine_state(state)
    try:
        failed = cluster("up", "--state-dir", str(state), "--node", "a=p5.48xlarge", "--node", "x=p9.unknown")
        assert failed.returncode == 1
        assert "node x" in failed.stderr and "p9.unknown" in failed.stderr, failed.stderr
        assert machine_state(state) == before, "a failed start left something behind"

        up = cluster("up", "--state-dir", str(state), "--node", "a=p5.48xlarge", "--node", "b=trn2.48xlarge",
                     "--lnc", "1")  # LNC 1 on the trn2 node; p5 has no such setting
        assert up.returncode == 0, up.stderr
        kubeconfig = up.stdout.strip().splitlines()[-1]
        client = Client(KubeConfig.from_file(kubeconfig))
        nodes = {n.metadata.name: n for n in client.list(Node)}  # type: ignore[union-attr]
        assert set(nodes) == {"a", "b"}
        for name, itype in (("a", "p5.48xlarge"), ("b", "trn2.48xlarge")):
            meta, spec, status = nodes[name].metadata, nodes[name].spec, nodes[name].status
            assert meta is not None and meta.labels is not None and spec is not None and status is not None
            assert meta.labels["node.kubernetes.io/instance-type"] == itype
            assert [c.status for c in status.conditions or [] if c.type == "Ready"] == ["True"]
            assert "node.kubernetes.io/not-ready" not in [t.key for t in spec.taints or []]
        assert cluster("status", "--state-dir", str(state)).returncode == 0

        env_out = cluster("node-env", "--state-dir", str(state), "b")
        assert env_out.returncode == 0
        env = dict(line.split("=", 1) for line in env_out.stdout.splitlines())
        assert set(env) == {"NODE_NAME", "HOST_ROOT", "KUBELET_ROOT", "DEVICE_PLUGINS_DIR", "CDI_ROOT", "KUBECONFIG",
                            "KUBELET_REGISTRAR_DIRECTORY_PATH", "KUBELET_PLUGINS_DIRECTORY_PATH"}
        assert env["NODE_NAME"] == "b" and env["KUBECONFIG"] == kubeconfig
        plugin = subprocess.Popen([sys.executable, "-m", "neuron_dra.deviceplugin.cli", "serve", "--metrics-port",
                                   "0"], env={**os.environ, "PYTHONPATH": str(REPO), **env},
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                status = client.get(Node, "b").status
                if status and (status.allocatable or {}).get("aws.amazon.com/neuroncore") == "128":
                    break
                time.sleep(0.3)
            else:
                raise AssertionError("neuroncore 128 (LNC 1) never reached Node b through `env $(node-env b)`")
        finally:
            plugin.terminate()
            plugin.wait(30)
        assert cluster("node-env", "--state-dir", str(state), "nope").returncode == 1
    finally:
        down = cluster("down", "--state-dir", str(state), "--purge")
    assert down.returncode == 0, down.stderr
    assert "kubelet/a" in down.stdout and "kubelet/b" in down.stdout
    assert machine_state(state) == before
    shutil.rmtree(base, ignore_errors=True)


@pytest.mark.containerd
def test_containerd_node_runs_a_container_whose_log_accel_cluster_prints(kube_binaries: Path) -> None:
    """`up --runtime containerd`: a real container runs on the node; `accel-cluster logs` prints what it wrote;
    `down` stops containerd, the shims and the containers, and leaves no process, mount or container cgroup."""
    base = Path(tempfile.mkdtemp(prefix="acl-ctr-"))  # on disk: containerd's image layers live in the node dir
    state = base / "cl"
    before = machine_state(state)
    cgroups_before = container_cgroups()
    try:
        up = cluster("up", "--state-dir", str(state), "--node", "c=p5.48xlarge", "--runtime", "containerd")
        assert up.returncode == 0, up.stderr
        assert "containerd" in up.stderr
        status = cluster("status", "--state-dir", str(state))
        assert status.returncode == 0 and "(containerd)" in status.stdout, status.stdout
        client = Client(KubeConfig.from_file(up.stdout.strip().splitlines()[-1]))
        deadline = time.monotonic() + 60
        while not list(client.list(ServiceAccount, namespace="default")) and time.monotonic() < deadline:
            time.sleep(0.3)
        pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "hello", "namespace": "default"},
               "spec": {"nodeName": "c", "restartPolicy": "Never", "containers": [
                   {"name": "app", "image": BUSYBOX_IMAGE, "imagePullPolicy": "Never",
                    "command": ["sh", "-c", "echo hello from $(hostname); id -u"]}]}}
        client.create(codecs.from_dict(pod))
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            phase = client.get(Pod, "hello", namespace="default").status.phase  # type: ignore[union-attr]
            if phase in ("Succeeded", "Failed"):
                break
            time.sleep(0.5)
        assert phase == "Succeeded", phase
        logs = cluster("logs", "--state-dir", str(state), "default/hello")
        assert logs.returncode == 0, logs.stderr
        assert logs.stdout == "hello from hello\n0\n"
        assert cluster("logs", "--state-dir", str(state), "default/nope").returncode == 1
    finally:
        down = cluster("down", "--state-dir", str(state), "--purge")
    assert down.returncode == 0, down.stderr
    assert "containerd/c" in down.stdout, down.stdout
    assert machine_state(state) == before
    assert container_cgroups() <= cgroups_before, "container cgroups left behind"
    shutil.rmtree(base, ignore_errors=True)
