"""The rig's way from the API server to containerd nodes and their pods: node slots (127.0.0.N and a pod range of
their own), the CONNECT target a route file resolves, the egress proxy's request parsing, and the pieces of
`accel-cluster env` and `accel-cluster logs --previous/--tail`."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from accel_rig.cluster import env_lines, pick_log_files, tail_lines
from accel_rig.controlplane_processes import process_start_ticks
from accel_rig.egressproxy import parse_connect
from accel_rig.noderoutes import (
    MAX_SLOT,
    NodeRoute,
    claim_slot,
    load_routes,
    loopback_ip,
    pick_slot,
    pod_prefix,
    route_for,
    save_route,
)


def test_slots_give_each_node_its_own_loopback_address_and_pod_range() -> None:
    assert pick_slot([]) == 0
    assert pick_slot([0, 1, 3]) == 2
    assert pick_slot([0, 1], own=5) == 5  # a restarted node keeps its slot
    assert pick_slot([5], own=5) == 0  # unless a live node took it meanwhile
    with pytest.raises(ValueError, match="slots are taken"):
        pick_slot(range(MAX_SLOT + 1))
    # 127.0.0.1 is the API server's; pods never reach the nodes' own 10.201.x.y
    assert loopback_ip(0) == "127.0.0.2" and loopback_ip(MAX_SLOT) == "127.0.0.112"
    assert pod_prefix(0) == "10.88" and pod_prefix(MAX_SLOT) == "10.198"


def _route(name: str, slot: int, pid: int = 1, ticks: int = 0) -> NodeRoute:
    return NodeRoute(name, slot, f"10.201.9.{slot + 2}", 40000 + slot, pid, ticks)


def test_a_connect_target_names_its_node_and_the_address_inside_it() -> None:
    routes = [_route("p5", 0), _route("trn2-a", 1)]
    # the API server dials a node by its name (the kubelet's Hostname address) or its address
    assert route_for("trn2-a", routes) == (routes[1], "10.201.9.3")
    assert route_for("10.201.9.2", routes) == (routes[0], "10.201.9.2")
    assert route_for("127.0.0.3", routes) == (routes[1], "10.201.9.3")
    # a pod IP is dialled as it is, in the namespace of the node whose range holds it
    assert route_for("10.89.0.7", routes) == (routes[1], "10.89.0.7")
    assert route_for("10.88.1.250", routes) == (routes[0], "10.88.1.250")
    # nothing else: no traffic leaves for the machine's network or the internet
    for host in ("10.90.0.2", "8.8.8.8", "example.com", "127.0.0.1", "trn2"):
        assert route_for(host, routes) is None, host


def test_route_files_round_trip_and_a_dead_node_gives_up_its_slot(tmp_path: Path) -> None:
    me = os.getpid()
    ticks = process_start_ticks(me)
    assert ticks is not None
    save_route(tmp_path, _route("a", 0, me, ticks))
    save_route(tmp_path, _route("gone", 1, me, ticks + 1))  # its holder's start time no longer matches
    (tmp_path / "bad.json").write_text("{not json")
    routes = load_routes(tmp_path)
    assert [r.name for r in routes] == ["a", "gone"]
    assert routes[0].alive() and not routes[1].alive()
    assert claim_slot(tmp_path, "a") == 0  # its own slot again
    assert claim_slot(tmp_path, "b") == 1  # the dead node's slot is free
    assert claim_slot(tmp_path, "gone") == 1


def test_parse_connect() -> None:
    assert parse_connect(b"CONNECT n1:10250 HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n") == ("n1", 10250)
    assert parse_connect(b"CONNECT 10.88.0.2:9810 HTTP/1.1\r\n\r\n") == ("10.88.0.2", 9810)
    for bad in (b"GET / HTTP/1.1\r\n\r\n", b"CONNECT n1 HTTP/1.1\r\n\r\n", b"CONNECT n1:0 HTTP/1.1\r\n\r\n",
                b"CONNECT n1:99999 HTTP/1.1\r\n\r\n", b"CONNECT :80 HTTP/1.1\r\n\r\n"):
        with pytest.raises(ValueError):
            parse_connect(bad)


def test_env_lines_put_the_cluster_binaries_first_and_quote_paths() -> None:
    lines = env_lines(Path("/c/bin dir"), Path("/s/admin.kubeconfig"))
    assert lines == ["export PATH='/c/bin dir':\"$PATH\"", "export KUBECONFIG=/s/admin.kubeconfig"]
    out = subprocess.run(["sh", "-c", "\n".join(lines) + '\necho "$PATH"; echo "$KUBECONFIG"'],
                         capture_output=True, text=True, check=True, env={"PATH": "/usr/bin:/bin"}).stdout
    assert out == "/c/bin dir:/usr/bin:/bin\n/s/admin.kubeconfig\n"
    assert env_lines(Path("/c/bin"), None) == ["export PATH=/c/bin:\"$PATH\""]


def test_logs_previous_is_the_run_before_the_newest_of_the_newest_pod(tmp_path: Path) -> None:
    old = [tmp_path / "old" / "0.log"]
    new = [tmp_path / "new" / "0.log", tmp_path / "new" / "1.log", tmp_path / "new" / "2.log"]
    assert pick_log_files([old, new], previous=False) == old + new
    assert pick_log_files([old, new], previous=True) == [new[1]]
    with pytest.raises(ValueError, match="not restarted"):
        pick_log_files([new[:1]], previous=True)
    lines = ["a\n", "b\n", "c\n"]
    assert tail_lines(lines, None) == lines
    assert tail_lines(lines, 2) == ["b\n", "c\n"]
    assert tail_lines(lines, 0) == []
    assert tail_lines(lines, 5) == lines
    assert tail_lines(lines, -1) == lines  # kubectl's --tail=-1: all


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("unshare") is None or shutil.which("ip") is None,
                    reason="needs root, unshare and ip to make a network namespace")
def test_egress_proxy_reaches_a_server_inside_a_node_namespace_and_nothing_else(tmp_path: Path) -> None:
    """A CONNECT through the egress proxy's Unix socket reaches a server listening only inside a network namespace
    of its own (as a node's kubelet or pod does); a target no route names is refused with 403."""
    holder = subprocess.Popen(["unshare", "--net", "--", "sh", "-c",
                               "ip link set lo up && ip addr add 10.201.9.2/32 dev lo && exec sleep 60"])
    server = proxy = None
    try:
        ticks = process_start_ticks(holder.pid)
        time.sleep(0.3)
        server = subprocess.Popen(["nsenter", f"--target={holder.pid}", "--net", "--", sys.executable, "-c",
                                   "import socket\ns = socket.create_server(('10.201.9.2', 9810))\n"
                                   "while True:\n    c, _ = s.accept(); c.sendall(b'inside\\n'); c.close()\n"])
        assert ticks is not None
        routes = tmp_path / "routes"
        save_route(routes, NodeRoute("n1", 0, "10.201.9.2", 10250, holder.pid, ticks))
        sock = tmp_path / "egress.sock"
        proxy = subprocess.Popen([sys.executable, "-m", "accel_rig.egressproxy", f"--socket={sock}",
                                  f"--routes={routes}"])
        deadline = time.monotonic() + 15
        while not sock.exists() and time.monotonic() < deadline:
            time.sleep(0.05)

        def connect(target: str) -> bytes:
            import socket
            with socket.socket(socket.AF_UNIX) as c:
                c.settimeout(5)
                c.connect(str(sock))
                c.sendall(f"CONNECT {target} HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n".encode())
                out = b""
                while chunk := c.recv(4096):
                    out += chunk
                return out

        reply = b""
        for _ in range(50):  # the server in the namespace may still be starting
            reply = connect("n1:9810")
            if reply.endswith(b"inside\n"):
                break
            time.sleep(0.1)
        assert reply == b"HTTP/1.1 200 Connection established\r\n\r\ninside\n"
        assert connect("10.201.9.2:9810").endswith(b"inside\n")
        assert connect("1.1.1.1:443").startswith(b"HTTP/1.1 403 ")
        assert connect("n1:9811").startswith(b"HTTP/1.1 502 ")  # nothing listens there inside the node
    finally:
        for p in (proxy, server, holder):
            if p is not None:
                p.kill()
                p.wait(timeout=10)


def test_logs_follow_prints_new_lines_and_a_restart_and_stops_with_the_pod(tmp_path: Path,
                                                                           capsys: pytest.CaptureFixture[str]) -> None:
    import threading

    from accel_rig.cluster import _follow

    d = tmp_path / "ns_p_uid" / "app"
    d.mkdir(parents=True)
    first = d / "0.log"
    first.write_text("2026-12-06T00:00:00Z stdout F old\n")
    runner = threading.Thread(target=_follow, args=([[first]], first.stat().st_size, 0.02))
    runner.start()
    with first.open("a") as f:
        f.write("2026-12-06T00:00:01Z stdout P new \n")
        f.flush()
        time.sleep(0.1)
        f.write("2026-12-06T00:00:01Z stdout F line\n2026-12-06T00:00:02Z stderr F half")  # no newline yet
    time.sleep(0.1)
    (d / "1.log").write_text("2026-12-06T00:00:03Z stdout F after the restart\n")
    time.sleep(0.2)
    shutil.rmtree(tmp_path / "ns_p_uid")  # the pod is gone
    runner.join(timeout=5)
    assert not runner.is_alive()
    assert capsys.readouterr().out == "new line\nafter the restart\n"
