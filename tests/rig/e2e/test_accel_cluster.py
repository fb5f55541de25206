"""``accel-cluster`` with real kubelet nodes, as a person uses it: up with nodes, node-env for the daemons, status,
down; and the machine as it was before (no processes, no mounts, no /var/lib/kubelet, the same sysctls), also after
a start that fails."""

from __future__ import annotations

import json
import os
import shutil
import ssl
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import psutil
import pytest
from accel_rig.containerdnode import BUSYBOX_IMAGE, FAKE_HOST_IN_NODE, RuntimeBinaries, ctr
from accel_rig.kubeletconfig import KUBELET_SYSCTLS
from lightkube import Client, KubeConfig, codecs
from lightkube.resources.core_v1 import Node, Pod, ServiceAccount

REPO = Path(__file__).resolve().parents[3]


def cluster(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "accel_rig.cluster", *args], capture_output=True,
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
    ours: set[str] = set()  # this node's container IDs (other test sessions may run containers meanwhile)
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
        assert cluster("logs", "--state-dir", str(state), "--tail", "1", "default/hello").stdout == "0\n"
        assert cluster("logs", "--state-dir", str(state), "default/nope").returncode == 1
        assert cluster("logs", "--state-dir", str(state), "--previous", "default/hello").returncode == 1

        # eval "$(accel-cluster env)": the cluster's own kubectl and helm first on PATH; kubectl logs reaches the
        # kubelet inside the node's namespace (through the API server's egress proxy)
        shell = subprocess.run(
            ["sh", "-c", f'eval "$({sys.executable} -m accel_rig.cluster env --state-dir {state})" && '
             'command -v kubectl && command -v helm && kubectl logs hello --tail 1'],
            capture_output=True, text=True, timeout=120, env={**os.environ, "PYTHONPATH": str(REPO),
                                                              "PATH": "/usr/bin:/bin"}, check=False)
        assert shell.returncode == 0, shell.stderr
        assert shell.stdout.splitlines() == [str(kube_binaries / "kubectl"), str(kube_binaries / "helm"), "0"]

        # the node's kubelet port on its own machine-loopback address (127.0.0.N), through the forwarder
        (line,) = [row for row in status.stdout.splitlines() if row.startswith("node c ")]
        loopback, _, port = line.split("kubelet ")[1].split()[0].partition(":")
        assert loopback.startswith("127.0.0.") and loopback != "127.0.0.1", line
        ctx = ssl.create_default_context(cafile=None)
        ctx.check_hostname, ctx.verify_mode = False, ssl.CERT_NONE  # the kubelet's self-signed serving cert
        ctx.load_cert_chain(str(state / "pki" / "admin.crt"), str(state / "pki" / "admin.key"))
        with urllib.request.build_opener(urllib.request.ProxyHandler({}), urllib.request.HTTPSHandler(
                context=ctx)).open(f"https://{loopback}:{port}/healthz", timeout=10) as r:
            assert r.read() == b"ok"

        # node-env: the fake host at the one in-node path every containerd node has (fakeHost.path of the charts)
        env = dict(row.split("=", 1) for row in cluster("node-env", "--state-dir", str(state), "c").stdout.split())
        assert env["HOST_ROOT"] == FAKE_HOST_IN_NODE
        assert Path(env["FAKE_HOST_DIR"], "sys", "class", "infiniband").is_dir()
        record = json.loads((state / "nodes" / "c" / "node.json").read_text())
        (holder,) = [p["pid"] for p in record["processes"] if p["name"] == "netns-holder"]
        inside = subprocess.run(["nsenter", f"--target={holder}", "--mount", "--", "ls",
                                 f"{FAKE_HOST_IN_NODE}/sys/class/infiniband_verbs"],
                                capture_output=True, text=True, timeout=30, check=True).stdout.split()
        # a p5.48xlarge's 32 EFA devices (AWS EFA document), seen inside the node
        assert len([n for n in inside if n.startswith("uverbs")]) == 32, inside
        ours.update(ctr(RuntimeBinaries.default(), state / "nodes" / "c" / "run" / "containerd" / "containerd.sock",
                        "containers", "list", "--quiet").stdout.split())
        assert ours, "containerd lists no container of the node"
    finally:
        down = cluster("down", "--state-dir", str(state), "--purge")
    assert down.returncode == 0, down.stderr
    assert "containerd/c" in down.stdout, down.stdout
    assert machine_state(state) == before
    assert not {p.name for p in container_cgroups()} & ours, "container cgroups left behind"
    shutil.rmtree(base, ignore_errors=True)
