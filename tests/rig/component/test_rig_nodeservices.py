"""A containerd rig node's cluster DNS and ClusterIP forwarding (rig/accel_rig/nodeservices.py), run for real in
two throw-away network namespaces standing for two nodes (root, util-linux, iproute2; nothing on the machine's own
network changes). The Service and EndpointSlice items are written as the API returns them."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Iterator

import pytest
from accel_rig.clusterdns import DNS_IP, parse_reply, query
from accel_rig.controlplane_pki import SERVICE_CIDR
from accel_rig.controlplane_processes import process_start_ticks
from accel_rig.netnsproxy import listen_in, socket_in, udp_socket_in
from accel_rig.noderoutes import NodeRoute
from accel_rig.nodeservices import NodeServices
from accel_rig.servicetable import ServiceTable, build
from netns_holder import holder

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="network namespaces need root")

WEB_IP = "10.0.0.77"
NAME = "web.shop.svc.cluster.local"
BIG = bytes(range(256)) * 4096 + b"pod on b\n"


@pytest.fixture
def nodes() -> Iterator[tuple[NodeRoute, NodeRoute]]:
    """Node a (slot 0: pods 10.88.x.y) set up as the rig sets a node up, with a pod address on its lo; node b (slot
    1: pods 10.89.x.y) with a pod address of its own."""
    a = holder(f"ip addr add {DNS_IP}/32 dev lo", f"ip route add local {SERVICE_CIDR} dev lo",
                "ip addr add 10.88.0.5/32 dev lo")
    b = holder("ip addr add 10.89.0.7/32 dev lo")
    try:
        routes = tuple(NodeRoute(name, slot, ip, 10250, p.pid, process_start_ticks(p.pid) or -1)
                       for name, slot, ip, p in (("a", 0, "10.201.0.2", a), ("b", 1, "10.201.0.3", b)))
        yield routes  # type: ignore[misc]
    finally:
        for p in (a, b):
            p.kill()
            p.wait(timeout=10)


def _table(endpoints: list[str]) -> ServiceTable:
    service = {"metadata": {"name": "web", "namespace": "shop"},
               "spec": {"type": "ClusterIP", "clusterIP": WEB_IP,
                        "ports": [{"name": "http", "port": 80, "targetPort": 8080, "protocol": "TCP"}]}}
    eps = {"metadata": {"name": "web-x1", "namespace": "shop", "labels": {"kubernetes.io/service-name": "web"}},
           "addressType": "IPv4", "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}],
           "endpoints": [{"addresses": [ip], "conditions": {"ready": True}} for ip in endpoints]}
    return build([service], [eps])


async def _pod_server(netns: str, ip: str, reply: bytes) -> asyncio.Server:
    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(reply)
        await writer.drain()
        writer.close()

    (sock,) = listen_in(netns, [(ip, 8080)])
    return await asyncio.start_server(serve, sock=sock)


async def _fetch_in(netns: str, ip: str, port: int) -> bytes:
    loop = asyncio.get_running_loop()
    sock = socket_in(netns)
    try:
        await asyncio.wait_for(loop.sock_connect(sock, (ip, port)), 5)
        out = b""
        while chunk := await asyncio.wait_for(loop.sock_recv(sock, 4096), 5):
            out += chunk
        return out
    finally:
        sock.close()


async def _dns_udp(netns: str, name: str) -> tuple[int, list[str]]:
    loop = asyncio.get_running_loop()
    sock = udp_socket_in(netns, ("0.0.0.0", 0))
    try:
        await loop.sock_sendto(sock, query(name), (DNS_IP, 53))
        data, _ = await asyncio.wait_for(loop.sock_recvfrom(sock, 512), 5)
        return parse_reply(data)
    finally:
        sock.close()


async def _dns_tcp(netns: str, name: str) -> tuple[int, list[str]]:
    loop = asyncio.get_running_loop()
    sock = socket_in(netns)
    try:
        await asyncio.wait_for(loop.sock_connect(sock, (DNS_IP, 53)), 5)
        msg = query(name)
        await loop.sock_sendall(sock, len(msg).to_bytes(2, "big") + msg)
        data = b""
        while len(data) < 2 or len(data) < 2 + int.from_bytes(data[:2], "big"):
            data += await asyncio.wait_for(loop.sock_recv(sock, 4096), 5)
        return parse_reply(data[2:])
    finally:
        sock.close()


def test_dns_and_a_cluster_ip_reaching_endpoints_on_the_node_and_another(nodes: tuple[NodeRoute, NodeRoute]) -> None:
    a, b = nodes

    async def scenario() -> None:
        servers = [await _pod_server(a.netns, "10.88.0.5", b"pod on a\n"),
                   await _pod_server(b.netns, "10.89.0.7", BIG)]
        node = NodeServices(a.netns, lambda: (ServiceTable(), []))
        await node.serve_dns()
        await node.apply(_table(["10.88.0.5", "10.89.0.7"]), [a, b])

        # DNS from inside node a, over UDP and TCP: the ClusterIP; another name is NXDOMAIN (rcode 3)
        assert await _dns_udp(a.netns, NAME) == (0, [WEB_IP])
        assert await _dns_tcp(a.netns, "WEB.shop.svc") == (0, [WEB_IP])
        assert (await _dns_udp(a.netns, "web.shop.svc.cluster.local.example.com"))[0] == 3

        # ClusterIP:80 inside node a reaches port 8080 of both endpoints in turn, b's through b's namespace
        replies = {await _fetch_in(a.netns, WEB_IP, 80) for _ in range(2)}
        assert replies == {b"pod on a\n", BIG}  # b's 1 MiB whole

        # an endpoint that refuses is skipped for the next one
        servers[0].close()
        await servers[0].wait_closed()
        assert {await _fetch_in(a.netns, WEB_IP, 80) for _ in range(2)} == {BIG}

        # the Service gone: no listener, its name NXDOMAIN
        await node.apply(ServiceTable(), [a, b])
        with pytest.raises(ConnectionRefusedError):
            await _fetch_in(a.netns, WEB_IP, 80)
        assert (await _dns_udp(a.netns, NAME))[0] == 3
        servers[1].close()

    asyncio.run(scenario())
