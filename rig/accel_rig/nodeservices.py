"""Cluster DNS and ClusterIP Services inside one containerd node of the rig (dev-only): the part of CoreDNS and
kube-proxy its pods need, with no iptables rule, no host interface and no traffic leaving the machine.

Every ``--interval`` seconds it lists Services and EndpointSlices from the API server (as ``system:kube-proxy``,
whom the default RBAC lets read them) and then, inside the node's network namespace (sockets made there with
``setns``, the process itself stays in the machine's):

- answers DNS (UDP and TCP) on ``169.254.20.10:53``, the kubelet's ``clusterDNS`` (:mod:`.clusterdns`);
- listens on every Service ``ClusterIP:port`` (TCP; the node routes the whole Service range to its ``lo`` as
  local, so any ClusterIP can be bound) and forwards each connection to a ready endpoint, round robin, trying the
  next on failure. The endpoint's socket is made in the namespace of the node that owns its address (a pod IP
  names its node, a host-network pod has its node's address; :mod:`.noderoutes`), so endpoints on other nodes
  are reached without any route between the nodes. The ``kubernetes`` Service is left to the API forwarder.

A failed list keeps the last table. It exits when the namespace's holder process (``--holder``) is gone.

    python -m accel_rig.nodeservices --netns /proc/PID/ns/net --holder PID --routes STATE/routes \
        --server https://127.0.0.1:6443 --ca ca.crt --cert proxy.crt --key proxy.key
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import http.client
import json
import os
import ssl
import sys
import urllib.parse
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, cast

from accel_rig.clusterdns import DNS_IP, answer
from accel_rig.controlplane_pki import SERVICE_IP
from accel_rig.netnsproxy import connect_in, listen_in, pipe, udp_socket_in
from accel_rig.noderoutes import NodeRoute, load_routes, route_for
from accel_rig.servicetable import ServicePort, ServiceTable, build

SERVICES = "/api/v1/services?resourceVersion=0"
SLICES = "/apis/discovery.k8s.io/v1/endpointslices?resourceVersion=0"
CONNECT_TIMEOUT = 5.0


def log(message: str) -> None:
    print(f"nodeservices: {message}", flush=True)


class ApiClient:
    """Blocking GETs over one kept-alive HTTPS connection (run in a worker thread)."""

    def __init__(self, server: str, ca: Path, cert: Path, key: Path) -> None:
        url = urllib.parse.urlsplit(server)
        self.host, self.port = url.hostname or "127.0.0.1", url.port or 443
        self.ctx = ssl.create_default_context(cafile=str(ca))
        self.ctx.load_cert_chain(str(cert), str(key))
        self.conn: http.client.HTTPSConnection | None = None

    def get(self, path: str) -> Any:
        for attempt in (0, 1):
            if self.conn is None:
                self.conn = http.client.HTTPSConnection(self.host, self.port, context=self.ctx, timeout=10)
            try:
                self.conn.request("GET", path, headers={"Accept": "application/json"})
                resp = self.conn.getresponse()
                body = resp.read()
            except (OSError, http.client.HTTPException):
                self.conn.close()
                self.conn = None
                if attempt:
                    raise
                continue
            if resp.status != 200:
                raise ValueError(f"GET {path}: HTTP {resp.status}: {body[:200].decode('utf-8', 'replace')}")
            return json.loads(body)
        raise AssertionError("unreachable")


def fetch_lists(api: ApiClient, routes_dir: Path) -> tuple[ServiceTable, list[NodeRoute]]:
    """Blocking: the table of the Services and EndpointSlices, and the live nodes' routes."""
    services = api.get(SERVICES).get("items") or []
    slices = api.get(SLICES).get("items") or []
    return build(services, slices), [r for r in load_routes(routes_dir) if r.alive()]


Fetch = Callable[[], tuple[ServiceTable, list[NodeRoute]]]


class NodeServices:
    """The DNS and ClusterIP listeners of one node namespace, refreshed with ``fetch`` (run in a thread)."""

    def __init__(self, netns: str, fetch: Fetch, dns_ip: str = DNS_IP) -> None:
        self.netns = netns
        self.fetch = fetch
        self.dns_ip = dns_ip
        self.table = ServiceTable()
        self.routes: list[NodeRoute] = []
        self.servers: dict[tuple[str, int], asyncio.Server] = {}
        self._failed: dict[tuple[str, int], str] = {}
        self._next: dict[tuple[str, int], int] = {}
        self._last_error = ""

    # ---- the lists

    async def refresh(self) -> None:
        try:
            table, routes = await asyncio.to_thread(self.fetch)
        except (OSError, http.client.HTTPException, ValueError, AttributeError) as e:
            if str(e) != self._last_error:
                log(f"cannot list Services and EndpointSlices (keeping the last ones): {e}")
                self._last_error = str(e)
            return
        if self._last_error:
            log("listing Services and EndpointSlices again")
            self._last_error = ""
        await self.apply(table, routes)

    async def apply(self, table: ServiceTable, routes: list[NodeRoute]) -> None:
        """Serve ``table``: a listener for each of its ClusterIP ports, none for the others."""
        self.table, self.routes = table, routes
        want = {k: sp for k, sp in self.table.ports.items() if k[0] != SERVICE_IP}
        for key in [k for k in self.servers if k not in want]:
            self.servers.pop(key).close()
            log(f"- {key[0]}:{key[1]}")
        for key, sp in want.items():
            if key in self.servers:
                continue
            try:
                (sock,) = listen_in(self.netns, [key])
            except OSError as e:
                if self._failed.get(key) != str(e):
                    log(f"cannot listen on {sp}: {e}")
                    self._failed[key] = str(e)
                continue
            self._failed.pop(key, None)
            self.servers[key] = await asyncio.start_server(functools.partial(self._forward, key), sock=sock)
            log(f"+ {sp}")

    # ---- ClusterIP forwarding

    async def _forward(self, key: tuple[str, int], reader: asyncio.StreamReader,
                       writer: asyncio.StreamWriter) -> None:
        sp = self.table.ports.get(key)
        endpoints = self.table.endpoints_of(sp) if sp is not None else []
        start = self._next.get(key, 0)
        self._next[key] = start + 1
        for i in range(len(endpoints)):
            ip, port = endpoints[(start + i) % len(endpoints)]
            found = route_for(ip, self.routes)
            if found is None:
                continue
            route, target = found
            try:
                up_reader, up_writer = await asyncio.wait_for(connect_in(route.netns, (target, port)),
                                                              CONNECT_TIMEOUT)
            except (OSError, TimeoutError):
                continue
            await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))
            return
        log(f"{_describe(sp, key)}: no ready endpoint reachable of {len(endpoints)}")
        writer.close()

    # ---- DNS

    async def serve_dns(self) -> None:
        loop = asyncio.get_running_loop()
        udp = udp_socket_in(self.netns, (self.dns_ip, 53))
        await loop.create_datagram_endpoint(lambda: _DnsUdp(self), sock=udp)
        (tcp,) = listen_in(self.netns, [(self.dns_ip, 53)])
        await asyncio.start_server(self._dns_tcp, sock=tcp)

    async def _dns_tcp(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                size = int.from_bytes(await asyncio.wait_for(reader.readexactly(2), 10), "big")
                reply = answer(await asyncio.wait_for(reader.readexactly(size), 10), self.table.records, 65535)
                if reply is None:
                    break
                writer.write(len(reply).to_bytes(2, "big") + reply)
                await writer.drain()
        except (asyncio.IncompleteReadError, TimeoutError, ConnectionError, OSError):
            pass
        finally:
            with contextlib.suppress(OSError):
                writer.close()


class _DnsUdp(asyncio.DatagramProtocol):
    def __init__(self, node: NodeServices) -> None:
        self.node = node
        self.transport: asyncio.DatagramTransport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.DatagramTransport, transport)

    def datagram_received(self, data: bytes, addr: tuple[str | Any, int]) -> None:
        reply = answer(data, self.node.table.records)
        if reply is not None and self.transport is not None:
            self.transport.sendto(reply, addr)


def _describe(sp: ServicePort | None, key: tuple[str, int]) -> str:
    return str(sp) if sp is not None else f"{key[0]}:{key[1]}"


async def run(node: NodeServices, holder: int | None, interval: float) -> None:
    await node.serve_dns()
    log(f"DNS on {node.dns_ip}:53 in {node.netns}")
    while holder is None or os.path.exists(f"/proc/{holder}"):
        await node.refresh()
        await asyncio.sleep(interval)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m accel_rig.nodeservices",
                                     description=__doc__.split("\n")[0])
    parser.add_argument("--netns", required=True, help="the node's namespace file, e.g. /proc/PID/ns/net")
    parser.add_argument("--holder", type=int, help="exit when this process is gone")
    parser.add_argument("--routes", type=Path, required=True, help="the control plane's node route files")
    parser.add_argument("--server", required=True, help="the API server's URL (from this process's namespace)")
    parser.add_argument("--ca", type=Path, required=True)
    parser.add_argument("--cert", type=Path, required=True)
    parser.add_argument("--key", type=Path, required=True)
    parser.add_argument("--dns-ip", default=DNS_IP)
    parser.add_argument("--interval", type=float, default=2.0, help="seconds between lists (default 2)")
    args = parser.parse_args(argv)
    try:
        api = ApiClient(args.server, args.ca, args.cert, args.key)
        node = NodeServices(args.netns, functools.partial(fetch_lists, api, args.routes), args.dns_ip)
        with contextlib.suppress(KeyboardInterrupt):
            asyncio.run(run(node, args.holder, args.interval))
    except (OSError, ssl.SSLError) as e:
        print(f"nodeservices: cannot start in {args.netns}: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
