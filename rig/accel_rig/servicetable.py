"""The rig's view of the cluster's Services (dev-only): what each node's DNS answers and which ClusterIP ports it
forwards where, from the API server's Service and EndpointSlice lists (plain JSON, as ``GET`` returns them).

An endpoint counts when its ``conditions.ready`` is not false (the API defines an unset condition as ready). A
Service port's endpoints are the EndpointSlice ports of the same name (``kubernetes.io/service-name`` label, IPv4,
TCP). ExternalName Services, UDP and SCTP ports are left out: the rig forwards TCP only.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from accel_rig.clusterdns import CLUSTER_DOMAIN, service_names

SERVICE_NAME_LABEL = "kubernetes.io/service-name"


@dataclass(frozen=True)
class ServicePort:
    """One TCP port of one Service's ClusterIP."""

    namespace: str
    service: str
    port_name: str
    ip: str
    port: int

    def __str__(self) -> str:
        name = f":{self.port_name}" if self.port_name else ""
        return f"{self.ip}:{self.port} ({self.namespace}/{self.service}{name})"


@dataclass(frozen=True)
class ServiceTable:
    records: dict[str, list[str]] = field(default_factory=dict)
    ports: dict[tuple[str, int], ServicePort] = field(default_factory=dict)
    #: (namespace, service, port name) -> ready (address, port), in the lists' order
    endpoints: dict[tuple[str, str, str], list[tuple[str, int]]] = field(default_factory=dict)

    def endpoints_of(self, sp: ServicePort) -> list[tuple[str, int]]:
        return self.endpoints.get((sp.namespace, sp.service, sp.port_name), [])


def _ready_endpoints(slices: Iterable[Mapping[str, Any]]) -> dict[tuple[str, str, str], list[tuple[str, int]]]:
    out: dict[tuple[str, str, str], list[tuple[str, int]]] = {}
    for s in slices:
        meta = s.get("metadata") or {}
        service = (meta.get("labels") or {}).get(SERVICE_NAME_LABEL)
        if not service or s.get("addressType") != "IPv4":
            continue
        addresses = [e["addresses"][0] for e in s.get("endpoints") or []
                     if e.get("addresses") and (e.get("conditions") or {}).get("ready") is not False]
        for p in s.get("ports") or []:
            if (p.get("protocol") or "TCP") != "TCP" or not isinstance(p.get("port"), int):
                continue
            key = (str(meta.get("namespace", "")), str(service), str(p.get("name") or ""))
            have = out.setdefault(key, [])
            have += [(a, p["port"]) for a in addresses if (a, p["port"]) not in have]
    return out


def build(services: Iterable[Mapping[str, Any]], slices: Iterable[Mapping[str, Any]],
          domain: str = CLUSTER_DOMAIN) -> ServiceTable:
    """The table for one moment's Service and EndpointSlice items."""
    endpoints = _ready_endpoints(slices)
    table = ServiceTable(endpoints=endpoints)
    for svc in services:
        meta, spec = svc.get("metadata") or {}, svc.get("spec") or {}
        name, namespace = str(meta.get("name", "")), str(meta.get("namespace", ""))
        if not name or not namespace or spec.get("type") == "ExternalName":
            continue
        ip = spec.get("clusterIP") or "None"
        if ip == "None":  # headless: the ready endpoints' own addresses
            addresses = sorted({a for (ns, sv, _), eps in endpoints.items() if (ns, sv) == (namespace, name)
                                for a, _ in eps})
        else:
            addresses = [ip]
            for p in spec.get("ports") or []:
                if (p.get("protocol") or "TCP") == "TCP" and isinstance(p.get("port"), int):
                    table.ports[(ip, p["port"])] = ServicePort(namespace, name, str(p.get("name") or ""), ip,
                                                               p["port"])
        for dns_name in service_names(name, namespace, domain):
            table.records[dns_name] = addresses
    return table
