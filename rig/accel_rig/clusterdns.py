"""Cluster DNS answers for the rig's containerd nodes (dev-only): Service A records in DNS wire format (RFC 1035).

The names are Kubernetes' DNS scheme with the cluster domain ``cluster.local``: ``<svc>.<ns>.svc.cluster.local``
(and ``<svc>.<ns>.svc``) is the Service's ClusterIP, or for a headless Service the addresses of its ready endpoints.
The kubelet writes a pod's resolv.conf with ``search <ns>.svc.cluster.local svc.cluster.local cluster.local`` and
``ndots:5``, so the short forms ``<svc>`` and ``<svc>.<ns>`` arrive here completed. Any other name is NXDOMAIN:
nothing is forwarded, no query leaves the machine. A known name asked for another type (AAAA) gets an empty
NOERROR answer, so resolvers use its A record.
"""

from __future__ import annotations

import ipaddress
import struct
from collections.abc import Mapping, Sequence

#: The kubelet's ``clusterDomain`` on containerd nodes.
CLUSTER_DOMAIN = "cluster.local"
#: The kubelet's ``clusterDNS`` on containerd nodes: a link-local address on each node's ``lo`` (the address
#: NodeLocal DNSCache uses), outside the Service range, so no Service can be given it.
DNS_IP = "169.254.20.10"
TTL = 5
UDP_LIMIT = 512

TYPE_A, TYPE_ANY, CLASS_IN = 1, 255, 1
NOERROR, FORMERR, NXDOMAIN, NOTIMP, REFUSED = 0, 1, 3, 4, 5
_QR, _AA, _TC, _RD = 0x8000, 0x0400, 0x0200, 0x0100

#: name (lower case, no trailing dot) -> IPv4 addresses
Records = Mapping[str, Sequence[str]]


def service_names(service: str, namespace: str, domain: str = CLUSTER_DOMAIN) -> tuple[str, str]:
    """The names a Service answers to."""
    short = f"{service}.{namespace}.svc".lower()
    return f"{short}.{domain}", short


def _question(msg: bytes) -> tuple[str, int, int, int] | None:
    """``(name, qtype, qclass, end offset)`` of the first question, or None when it is malformed."""
    labels: list[str] = []
    i = 12
    while True:
        if i >= len(msg):
            return None
        n = msg[i]
        if n == 0:
            i += 1
            break
        if n & 0xC0 or i + 1 + n > len(msg):  # no compression pointers in a question's only name
            return None
        labels.append(msg[i + 1:i + 1 + n].decode("ascii", "replace").lower())
        i += 1 + n
    if i + 4 > len(msg):
        return None
    qtype, qclass = struct.unpack_from("!HH", msg, i)
    return ".".join(labels), qtype, qclass, i + 4


def _header(qid: int, flags: int, rcode: int, qd: int, an: int, tc: bool = False) -> bytes:
    out = _QR | _AA | (flags & (0x7800 | _RD)) | (_TC if tc else 0) | rcode
    return struct.pack("!HHHHHH", qid, out, qd, an, 0, 0)


def answer(query: bytes, records: Records, limit: int = UDP_LIMIT) -> bytes | None:
    """The reply to one DNS message, at most ``limit`` bytes (TC set when answers were left out), or None when
    ``query`` is no query at all (too short, or a response)."""
    if len(query) < 12:
        return None
    qid, flags, qdcount = struct.unpack_from("!HHH", query)
    if flags & _QR:
        return None
    q = _question(query) if qdcount == 1 else None
    if q is None:
        return _header(qid, flags, FORMERR, 0, 0)
    name, qtype, qclass, end = q
    question = query[12:end]
    if (flags >> 11) & 0xF != 0:
        return _header(qid, flags, NOTIMP, 1, 0) + question
    if qclass != CLASS_IN:
        return _header(qid, flags, REFUSED, 1, 0) + question
    addresses = records.get(name.rstrip("."))
    if addresses is None:
        return _header(qid, flags, NXDOMAIN, 1, 0) + question
    wanted = list(addresses) if qtype in (TYPE_A, TYPE_ANY) else []
    room = max(0, (limit - 12 - len(question)) // 16)
    body = b"".join(struct.pack("!HHHIH", 0xC00C, TYPE_A, CLASS_IN, TTL, 4) + ipaddress.IPv4Address(ip).packed
                    for ip in wanted[:room])
    return _header(qid, flags, NOERROR, 1, min(room, len(wanted)), tc=len(wanted) > room) + question + body


def query(name: str, qtype: int = TYPE_A, qid: int = 0x1234) -> bytes:
    """A DNS query message for ``name`` (recursion desired), as a stub resolver sends it."""
    labels = b"".join(bytes([len(p)]) + p.encode("ascii") for p in name.rstrip(".").split(".") if p)
    return struct.pack("!HHHHHH", qid, _RD, 1, 0, 0, 0) + labels + b"\0" + struct.pack("!HH", qtype, CLASS_IN)


def parse_reply(msg: bytes) -> tuple[int, list[str]]:
    """``(rcode, A addresses)`` of a reply to :func:`query` (answers named by a pointer to the question)."""
    flags, qd, an = struct.unpack_from("!xxHHH", msg)
    q = _question(msg) if qd == 1 else None
    i = q[3] if q is not None else 12
    out = []
    for _ in range(an):
        rtype, _cls, _ttl, rdlen = struct.unpack_from("!HHIH", msg, i + 2)
        rdata = msg[i + 12:i + 12 + rdlen]
        if rtype == TYPE_A and rdlen == 4:
            out.append(str(ipaddress.IPv4Address(rdata)))
        i += 12 + rdlen
    return flags & 0xF, out
