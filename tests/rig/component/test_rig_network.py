"""The network pieces of a containerd rig node, run for real in throw-away network namespaces (root, util-linux,
iproute2; nothing on the machine's own network changes): the CNI plugin wires a pod namespace to a node namespace,
and the forwarder carries a connection from inside a namespace to the machine's loopback."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from accel_rig.containerdnode import CNI_PLUGIN
from netns_holder import holder

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="network namespaces need root")


@pytest.fixture
def namespaces() -> Iterator[list[subprocess.Popen[bytes]]]:
    made: list[subprocess.Popen[bytes]] = []
    yield made
    for p in made:
        p.kill()
        p.wait()


def _in(pid: int, *cmd: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["nsenter", f"--net=/proc/{pid}/ns/net", "--", *cmd], capture_output=True, text=True,
                          timeout=30, check=False)


def test_cni_add_wires_the_pod_to_the_node(namespaces: list[subprocess.Popen[bytes]], tmp_path: Path) -> None:
    node = holder("ip addr add 10.201.7.9/32 dev lo")
    pod = holder()
    namespaces += [node, pod]
    conf = {"cniVersion": "1.0.0", "name": "accel-rig", "type": "accel-veth", "nodeIP": "10.201.7.9",
            "podPrefix": "10.88", "stateDir": str(tmp_path / "state")}
    env = {**os.environ, "CNI_COMMAND": "ADD", "CNI_CONTAINERID": "0123456789abcdef0123",
           "CNI_NETNS": f"/proc/{pod.pid}/ns/net", "CNI_IFNAME": "eth0", "CNI_PATH": str(CNI_PLUGIN.parent)}
    out = subprocess.run(["nsenter", f"--net=/proc/{node.pid}/ns/net", "--", str(CNI_PLUGIN)],
                         input=json.dumps(conf), capture_output=True, text=True, env=env, timeout=30, check=False)
    assert out.returncode == 0, out.stdout + out.stderr
    result = json.loads(out.stdout)
    (ip,) = result["ips"]
    assert ip["address"] == "10.88.0.2/32" and result["interfaces"][0]["name"] == "eth0"
    assert "10.88.0.2/32" in _in(pod.pid, "ip", "-o", "addr", "show", "dev", "eth0").stdout
    # The pod reaches the node's address over the veth, and the node answers it at the pod's own address.
    server = subprocess.Popen(["nsenter", f"--net=/proc/{node.pid}/ns/net", "--", sys.executable, "-c",
                               "import socket; s = socket.create_server(('10.201.7.9', 8080)); print('up', flush=True)"
                               "; c, a = s.accept(); c.sendall(a[0].encode())"], stdout=subprocess.PIPE)
    try:
        assert server.stdout is not None and server.stdout.readline() == b"up\n"
        client = _in(pod.pid, sys.executable, "-c", "import socket; s = socket.create_connection(('10.201.7.9', "
                     "8080), timeout=5); print(s.recv(100).decode())")
        assert client.stdout.strip() == "10.88.0.2", client.stderr
    finally:
        server.kill()
        server.wait()
    # A second pod gets the next address.
    pod2 = holder()
    namespaces.append(pod2)
    env2 = {**env, "CNI_CONTAINERID": "fedcba9876543210fedc", "CNI_NETNS": f"/proc/{pod2.pid}/ns/net"}
    out2 = subprocess.run(["nsenter", f"--net=/proc/{node.pid}/ns/net", "--", str(CNI_PLUGIN)],
                          input=json.dumps(conf), capture_output=True, text=True, env=env2, timeout=30, check=False)
    assert json.loads(out2.stdout)["ips"][0]["address"] == "10.88.0.3/32"
    # DEL removes the node side of the pair.
    delete = subprocess.run(["nsenter", f"--net=/proc/{node.pid}/ns/net", "--", str(CNI_PLUGIN)],
                            input=json.dumps(conf), capture_output=True, text=True,
                            env={**env, "CNI_COMMAND": "DEL"}, timeout=30, check=False)
    assert delete.returncode == 0
    assert "va0123456789ab" not in _in(node.pid, "ip", "-o", "link").stdout


def test_cni_add_without_config_fails_with_a_cni_error(namespaces: list[subprocess.Popen[bytes]]) -> None:
    pod = holder()
    namespaces.append(pod)
    env = {**os.environ, "CNI_COMMAND": "ADD", "CNI_CONTAINERID": "x", "CNI_NETNS": f"/proc/{pod.pid}/ns/net",
           "CNI_IFNAME": "eth0"}
    out = subprocess.run([str(CNI_PLUGIN)], input="{}", capture_output=True, text=True, env=env, timeout=30,
                         check=False)
    assert out.returncode != 0
    assert "nodeIP, podPrefix and stateDir are required" in json.loads(out.stdout)["msg"]


def test_forwarder_carries_a_connection_out_of_the_namespace(namespaces: list[subprocess.Popen[bytes]]) -> None:
    server = socket.create_server(("127.0.0.1", 0))
    port = server.getsockname()[1]

    def echo() -> None:
        conn, _ = server.accept()
        with conn:
            conn.sendall(b"echo:" + conn.recv(100))

    threading.Thread(target=echo, daemon=True).start()
    node = holder("ip addr add 10.0.0.1/32 dev lo")
    namespaces.append(node)
    proxy = subprocess.Popen([sys.executable, "-m", "accel_rig.netnsproxy",
                              f"--netns=/proc/{node.pid}/ns/net", "--listen=10.0.0.1:443",
                              f"--to=127.0.0.1:{port}", f"--holder={node.pid}"], stdout=subprocess.PIPE)
    try:
        assert proxy.stdout is not None and b"netnsproxy:" in proxy.stdout.readline()
        client = ("import socket; s = socket.create_connection(('10.0.0.1', 443), timeout=5); "
                  "s.sendall(b'hi'); print(s.recv(100).decode())")
        out = _in(node.pid, sys.executable, "-c", client)
        assert out.stdout.strip() == "echo:hi", out.stderr
        # The listening socket lives in the node's namespace (nothing is tried from the machine's own namespace:
        # only loopback is a target here).
        assert "10.0.0.1:443" in _in(node.pid, "ss", "-ltnH").stdout
        # The forwarder ends with the namespace's holder.
        node.kill()
        node.wait()
        deadline = time.monotonic() + 10
        while proxy.poll() is None and time.monotonic() < deadline:
            time.sleep(0.1)
        assert proxy.poll() == 0
    finally:
        proxy.kill()
        proxy.wait()
        server.close()
