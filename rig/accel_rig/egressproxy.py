"""The API server's way into the rig's containerd nodes (dev-only): an HTTP CONNECT proxy on a Unix socket, named
by the API server's egress selector for its ``cluster`` traffic (kubelet calls for ``kubectl logs/exec/
port-forward``, and the service, pod and node proxy).

The nodes live in network namespaces of their own, so neither a node's name nor its 10.201.x.y address nor a pod's
10.88+.x.y address is reachable from the machine. For ``CONNECT host:port`` this proxy finds the node that owns
``host`` in the control plane's route files (:mod:`accel_rig.noderoutes`), opens the socket *inside*
that node's namespace (``setns`` on the event-loop thread, then back) and pipes the bytes. Any other target is
refused: no connection of the API server's leaves the machine's loopback and the rig's namespaces.

    python -m accel_rig.egressproxy --socket STATE/egress.sock --routes STATE/routes
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from accel_rig.netnsproxy import pipe, socket_in
from accel_rig.noderoutes import NodeRoute, load_routes, route_for

MAX_HEAD = 16 * 1024


def parse_connect(head: bytes) -> tuple[str, int]:
    """``(host, port)`` of an HTTP CONNECT request head; ValueError naming what is wrong."""
    line = head.split(b"\r\n", 1)[0].decode("latin-1")
    parts = line.split()
    if len(parts) != 3 or parts[0] != "CONNECT" or not parts[2].startswith("HTTP/1."):
        raise ValueError(f"not a CONNECT request: {line[:200]!r}")
    host, sep, port = parts[1].rpartition(":")
    host = host.strip("[]")
    if not sep or not host or not port.isdecimal() or not 0 < int(port) < 65536:
        raise ValueError(f"CONNECT target is not HOST:PORT: {parts[1][:200]!r}")
    return host, int(port)


def _reply(writer: asyncio.StreamWriter, code: int, reason: str, message: str = "") -> None:
    body = (message + "\n").encode() if message else b""
    writer.write(f"HTTP/1.1 {code} {reason}\r\nContent-Length: {len(body)}\r\n\r\n".encode() + body)


async def _open_in(route: NodeRoute, ip: str, port: int) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    sock = socket_in(route.netns)  # made in the node's namespace; connects there
    try:
        await asyncio.get_running_loop().sock_connect(sock, (ip, port))
    except BaseException:
        sock.close()
        raise
    return await asyncio.open_connection(sock=sock)


async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, routes_dir: Path) -> None:
    try:
        head = await reader.readuntil(b"\r\n\r\n")
    except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, ConnectionError):
        writer.close()
        return
    try:
        host, port = parse_connect(head)
    except ValueError as e:
        _reply(writer, 400, "Bad Request", str(e))
        writer.close()
        return
    found = route_for(host, [r for r in load_routes(routes_dir) if r.alive()])
    if found is None:
        print(f"egressproxy: refused {host}:{port}: no running rig node has that name or address", flush=True)
        _reply(writer, 403, "Forbidden", f"{host} is not a running rig node, its address or one of its pods")
        writer.close()
        return
    route, ip = found
    try:
        up_reader, up_writer = await _open_in(route, ip, port)
    except OSError as e:
        _reply(writer, 502, "Bad Gateway", f"{ip}:{port} in node {route.name}: {e.strerror or e}")
        writer.close()
        return
    writer.write(b"HTTP/1.1 200 Connection established\r\n\r\n")
    await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))


async def serve(path: Path, routes_dir: Path) -> None:
    path.unlink(missing_ok=True)
    server = await asyncio.start_unix_server(lambda r, w: handle(r, w, routes_dir), path=str(path),
                                             limit=MAX_HEAD)
    os.chmod(path, 0o600)
    print(f"egressproxy: serving {path}, routes from {routes_dir}", flush=True)
    async with server:
        await server.serve_forever()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m accel_rig.egressproxy",
                                     description=__doc__.split("\n")[0])
    parser.add_argument("--socket", type=Path, required=True, help="the Unix socket the API server dials")
    parser.add_argument("--routes", type=Path, required=True, help="the nodes' route files")
    args = parser.parse_args(argv)
    with contextlib.suppress(KeyboardInterrupt):
        try:
            asyncio.run(serve(args.socket, args.routes))
        except OSError as e:
            print(f"egressproxy: cannot serve {args.socket}: {e}", file=sys.stderr)
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

