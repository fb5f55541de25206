"""A TCP forwarder from inside a node's network namespace to the machine's loopback (dev-only).

A containerd node of the rig lives in its own network namespace (so its pods, its host-network DaemonSets and its
ports never touch the machine's network). Its kubelet and its pods still have to reach the API server, which
listens on the machine's 127.0.0.1. This forwarder creates its listening sockets inside the node's namespace
(``setns`` on the main thread, before any other thread exists), returns to its own namespace, and connects every
accepted connection to the target there: the part of kube-proxy the rig needs (the ``kubernetes`` Service's
ClusterIP, and the API server's own address for the kubelet), with no iptables rule and no host interface.

    python -m accel_rig.netnsproxy --netns /proc/PID/ns/net --listen 10.0.0.1:443 --to 127.0.0.1:6443

With ``--into`` it works the other way: it listens in its own namespace (the machine's loopback, e.g. a node's
127.0.0.N) and connects every accepted connection to the target inside the node's namespace (the node's kubelet).

    python -m accel_rig.netnsproxy --netns /proc/PID/ns/net --into --listen 127.0.0.2:10250 \
        --to 10.201.3.4:10250

It exits when the namespace's holder process (``--holder PID``) is gone.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import ctypes
import os
import socket
import sys
from collections.abc import Iterator, Sequence

CLONE_NEWNET = 0x40000000


def _setns(fd: int) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.setns(fd, CLONE_NEWNET) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"setns: {os.strerror(err)}")


@contextlib.contextmanager
def _inside(netns: str) -> Iterator[None]:
    """Run the block inside the network namespace ``netns``; the calling thread's namespace is restored after."""
    own = os.open("/proc/self/ns/net", os.O_RDONLY)
    target = os.open(netns, os.O_RDONLY)
    try:
        _setns(target)
        try:
            yield
        finally:
            _setns(own)
    finally:
        os.close(own)
        os.close(target)


def listen_in(netns: str, addresses: Sequence[tuple[str, int]]) -> list[socket.socket]:
    """Listening sockets bound inside the network namespace ``netns``; the caller's namespace is restored."""
    with _inside(netns):
        return [socket.create_server(addr, reuse_port=False) for addr in addresses]


def socket_in(netns: str) -> socket.socket:
    """A non-blocking TCP socket made inside the network namespace ``netns`` (it connects there); the calling
    thread's namespace is restored before this returns."""
    with _inside(netns):
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setblocking(False)
    return sock


def udp_socket_in(netns: str, address: tuple[str, int]) -> socket.socket:
    """A UDP socket bound to ``address`` inside the network namespace ``netns``; the caller's namespace is
    restored."""
    with _inside(netns):
        sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        try:
            sock.bind(address)
        except OSError:
            sock.close()
            raise
    sock.setblocking(False)
    return sock


async def pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(1 << 16):
            writer.write(data)
            await writer.drain()
    except (ConnectionError, OSError):
        pass
    finally:
        with contextlib.suppress(OSError):
            writer.close()


async def connect_in(netns: str, target: tuple[str, int]) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    sock = socket_in(netns)
    try:
        await asyncio.get_running_loop().sock_connect(sock, target)
    except BaseException:
        sock.close()
        raise
    return await asyncio.open_connection(sock=sock)


async def _serve(listeners: list[socket.socket], target: tuple[str, int], holder: int | None,
                 into: str | None = None) -> None:
    async def forward(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await (connect_in(into, target) if into else asyncio.open_connection(*target))
        except OSError:
            writer.close()
            return
        await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))

    servers = [await asyncio.start_server(forward, sock=s) for s in listeners]
    try:
        while holder is None or os.path.exists(f"/proc/{holder}"):
            await asyncio.sleep(1.0)
    finally:
        for server in servers:
            server.close()


def _address(text: str) -> tuple[str, int]:
    host, _, port = text.rpartition(":")
    if not host or not port.isdecimal():
        raise argparse.ArgumentTypeError(f"want HOST:PORT, got {text!r}")
    return host, int(port)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m accel_rig.netnsproxy",
                                     description=__doc__.split("\n")[0])
    parser.add_argument("--netns", required=True, help="the namespace file, e.g. /proc/PID/ns/net")
    parser.add_argument("--listen", type=_address, action="append", required=True,
                        help="HOST:PORT in the namespace (with --into: in this process's namespace)")
    parser.add_argument("--to", type=_address, required=True,
                        help="HOST:PORT in this process's namespace (with --into: in the namespace)")
    parser.add_argument("--into", action="store_true", help="listen here, connect inside the namespace")
    parser.add_argument("--holder", type=int, help="exit when this process is gone")
    args = parser.parse_args(argv)
    try:
        listeners = ([socket.create_server(a) for a in args.listen] if args.into
                     else listen_in(args.netns, args.listen))
    except OSError as e:
        print(f"netnsproxy: cannot listen {'on' if args.into else 'in ' + args.netns}: {e}", file=sys.stderr)
        return 1
    where = ("", f" in {args.netns}") if args.into else (f" in {args.netns}", "")
    print(f"netnsproxy: {', '.join(f'{h}:{p}' for h, p in args.listen)}{where[0]} -> "
          f"{args.to[0]}:{args.to[1]}{where[1]}", flush=True)
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(_serve(listeners, args.to, args.holder, args.netns if args.into else None))
    return 0


if __name__ == "__main__":
    sys.exit(main())
