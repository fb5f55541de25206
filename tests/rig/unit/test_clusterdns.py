"""The rig's cluster DNS answers (rig/accel_rig/clusterdns.py) and its Service table (servicetable.py).

Queries are written byte by byte from RFC 1035 (header 4.1.1, question 4.1.2, resource record 4.1.3), not with the
module's own helper; the Service names are Kubernetes' DNS scheme (``<svc>.<ns>.svc.cluster.local``).
"""

from __future__ import annotations

import struct
from typing import Any

from accel_rig.clusterdns import answer, parse_reply, query
from accel_rig.servicetable import build

EXTENDER = "neuron-scheduler-extender.kube-system.svc.cluster.local"


def raw_query(name: str, qtype: int, qid: int = 0xBEEF) -> bytes:
    # ID, flags: RD only (0x0100), QDCOUNT 1, AN/NS/AR 0; QNAME labels; QTYPE; QCLASS IN (1)
    qname = b"".join(bytes([len(label)]) + label.encode() for label in name.split(".")) + b"\x00"
    return struct.pack(">HHHHHH", qid, 0x0100, 1, 0, 0, 0) + qname + struct.pack(">HH", qtype, 1)


RECORDS = {EXTENDER: ["10.0.0.42"], "neuron-scheduler-extender.kube-system.svc": ["10.0.0.42"]}


def test_a_record_of_a_service() -> None:
    q = raw_query(EXTENDER, 1)
    reply = answer(q, RECORDS)
    assert reply is not None
    qid, flags, qd, an, ns, ar = struct.unpack(">HHHHHH", reply[:12])
    # QR=1, opcode 0, AA=1, RD copied, RCODE 0
    assert (qid, flags & 0x8000, flags & 0x0400, flags & 0x0100, flags & 0xF) == (0xBEEF, 0x8000, 0x0400, 0x0100, 0)
    assert (qd, an, ns, ar) == (1, 1, 0, 0)
    assert reply[12:len(q)] == q[12:]  # the question echoed
    # NAME as a pointer to offset 12, TYPE A, CLASS IN, TTL, RDLENGTH 4, 10.0.0.42
    rr = reply[len(q):]
    assert rr[:4] == b"\xc0\x0c\x00\x01" and rr[4:6] == b"\x00\x01" and rr[10:] == b"\x00\x04\x0a\x00\x00\x2a"


def test_names_are_case_insensitive_and_the_short_svc_form_answers() -> None:
    assert parse_reply(answer(raw_query(EXTENDER.upper(), 1), RECORDS) or b"") == (0, ["10.0.0.42"])
    short = "neuron-scheduler-extender.kube-system.svc"
    assert parse_reply(answer(raw_query(short, 1), RECORDS) or b"") == (0, ["10.0.0.42"])


def test_unknown_names_and_search_list_misses_are_nxdomain() -> None:
    # with ndots:5 a resolver tries "<name>.<ns>.svc.cluster.local" first: that one is no Service
    for name in ("neuron-scheduler-extender.kube-system.svc.kube-system.svc.cluster.local", "example.com",
                 "kube-system.svc.cluster.local"):
        reply = answer(raw_query(name, 1), RECORDS) or b""
        assert struct.unpack(">H", reply[2:4])[0] & 0xF == 3, name
        assert struct.unpack(">H", reply[6:8])[0] == 0


def test_aaaa_of_a_known_name_is_empty_noerror() -> None:
    assert parse_reply(answer(raw_query(EXTENDER, 28), RECORDS) or b"") == (0, [])


def test_not_a_query() -> None:
    assert answer(b"\x00\x01", RECORDS) is None  # too short
    response = bytearray(raw_query(EXTENDER, 1))
    response[2] |= 0x80
    assert answer(bytes(response), RECORDS) is None  # a response is never answered
    bad = answer(raw_query(EXTENDER, 1)[:20], RECORDS) or b""  # question cut short
    assert struct.unpack(">H", bad[2:4])[0] & 0xF == 1  # FORMERR


def test_many_addresses_are_truncated_to_512_bytes_with_tc() -> None:
    many = {EXTENDER: [f"10.88.0.{i}" for i in range(2, 60)]}
    reply = answer(raw_query(EXTENDER, 1), many) or b""
    assert len(reply) <= 512 and struct.unpack(">H", reply[2:4])[0] & 0x0200
    full = answer(raw_query(EXTENDER, 1), many, limit=65535) or b""
    assert parse_reply(full)[1] == many[EXTENDER]
    assert not struct.unpack(">H", full[2:4])[0] & 0x0200


def test_query_helper_matches_rfc_bytes() -> None:
    assert query(EXTENDER, 1, qid=0xBEEF) == raw_query(EXTENDER, 1)


def _svc(name: str, ns: str, ip: str, ports: list[dict[str, Any]], kind: str = "ClusterIP") -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": ns}, "spec": {"type": kind, "clusterIP": ip, "ports": ports}}


def _slice(svc: str, ns: str, ports: list[dict[str, Any]], endpoints: list[dict[str, Any]]) -> dict[str, Any]:
    return {"metadata": {"name": f"{svc}-abc", "namespace": ns, "labels": {"kubernetes.io/service-name": svc}},
            "addressType": "IPv4", "ports": ports, "endpoints": endpoints}


def test_service_table_from_api_lists() -> None:
    services = [
        _svc("web", "a", "10.0.0.20", [{"name": "http", "port": 80, "targetPort": 8080, "protocol": "TCP"},
                                       {"name": "dns", "port": 53, "protocol": "UDP"}]),
        _svc("db", "a", "None", [{"port": 5432}]),
        _svc("ext", "a", "", [], kind="ExternalName"),
    ]
    slices = [
        _slice("web", "a", [{"name": "http", "port": 8080, "protocol": "TCP"}],
               [{"addresses": ["10.88.0.5"], "conditions": {"ready": True}},
                {"addresses": ["10.89.0.7"]},  # an unset ready condition counts as ready (EndpointConditions)
                {"addresses": ["10.88.0.9"], "conditions": {"ready": False, "terminating": True}}]),
        _slice("db", "a", [{"name": "", "port": 5432}], [{"addresses": ["10.88.0.11"]}, {"addresses": ["10.88.0.3"]}]),
    ]
    table = build(services, slices)
    assert table.records["web.a.svc.cluster.local"] == ["10.0.0.20"] == table.records["web.a.svc"]
    assert table.records["db.a.svc.cluster.local"] == ["10.88.0.11", "10.88.0.3"]  # headless: the endpoints
    assert "ext.a.svc.cluster.local" not in table.records
    assert set(table.ports) == {("10.0.0.20", 80)}  # TCP only, headless has no ClusterIP
    assert table.endpoints_of(table.ports[("10.0.0.20", 80)]) == [("10.88.0.5", 8080), ("10.89.0.7", 8080)]
