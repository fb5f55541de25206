"""Cluster DNS and ClusterIP Services for pods on the rig's containerd nodes (rig/accel_rig/nodeservices.py).

Two containerd nodes; a busybox ``httpd`` pod on the first behind a Service whose port (8081) differs from the
pod's (8080); busybox client pods on both nodes resolve the Service's names with ``nslookup`` and fetch its page
with ``wget`` by the short name (the kubelet's search domains) and the ``<svc>.<ns>.svc`` form. Expected values come
from the API server (the ClusterIP it allocated) and from Kubernetes' DNS scheme and resolv.conf rules; a name
that is no Service is NXDOMAIN. Deleting the server pod leaves the Service with no endpoint: the connection fails;
deleting the Service makes its name NXDOMAIN and closes its ClusterIP port.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import pytest
from accel_rig.clusterdns import DNS_IP
from accel_rig.nodelayout import CONTAINERD
from kube_fixtures import RealNode
from lightkube import Client
from lightkube.resources.core_v1 import Pod, Service

Wait = Callable[..., Any]
BUSYBOX = "example.local/busybox:1.35"


def _pod(name: str, namespace: str, node: str, script: str, *, labels: dict[str, str] | None = None,
         restart: str = "Never", port: int | None = None) -> Pod:
    container: dict[str, Any] = {"name": "main", "image": BUSYBOX, "imagePullPolicy": "Never",
                                 "command": ["sh", "-c", script]}
    if port is not None:
        container["readinessProbe"] = {"tcpSocket": {"port": port}, "periodSeconds": 1}
    return Pod.from_dict({"metadata": {"name": name, "namespace": namespace, "labels": labels or {}},
                          "spec": {"nodeName": node, "restartPolicy": restart, "terminationGracePeriodSeconds": 1,
                                   "containers": [container]}})


def _finished_log(client: Client, node: RealNode, namespace: str, name: str, wait: Wait) -> str:
    phase = wait(lambda: next((p for p in ("Succeeded", "Failed")
                               if client.get(Pod, name, namespace=namespace).status.phase == p), None),
                 f"pod {name} finished", timeout=120)
    text = node.kubelet.pod_log(namespace, name, "main")
    assert phase == "Succeeded", text
    return text


@pytest.mark.containerd
@pytest.mark.timeout(600)
def test_pods_resolve_and_reach_a_service_on_their_node_and_another(
        kubelet_node: Callable[..., RealNode], kube_client: Client, namespace: str, wait: Wait) -> None:
    a = kubelet_node("trn2.48xlarge", runtime=CONTAINERD)
    b = kubelet_node("trn2.48xlarge", runtime=CONTAINERD)
    kube_client.create(_pod("web", namespace, a.name, "mkdir -p /www && echo hello-from-web > /www/index.html && "
                            "exec httpd -f -p 8080 -h /www", labels={"app": "web"}, restart="Always", port=8080))
    kube_client.create(Service.from_dict({  # type: ignore[call-overload]
        "metadata": {"name": "web", "namespace": namespace},
        "spec": {"selector": {"app": "web"}, "ports": [{"name": "http", "port": 8081, "targetPort": 8080}]}}))
    wait(lambda: kube_client.get(Pod, "web", namespace=namespace).status.podIP, "the web pod's address", timeout=120)
    cluster_ip = kube_client.get(Service, "web", namespace=namespace).spec.clusterIP
    full = f"web.{namespace}.svc.cluster.local"
    # the node's view of the Services refreshes every 2 s (later on a loaded machine): ask until it answers
    script = (f"cat /etc/resolv.conf; for i in $(seq 30); do nslookup {full} > /tmp/ns 2>&1 && break; sleep 1; "
              f"done; cat /tmp/ns; nslookup nosuch.{namespace}.svc.cluster.local; "
              # the endpoint becomes ready after the readiness probe; the node's view refreshes every 2 s
              "for i in $(seq 30); do timeout 5 wget -q -O /tmp/page http://web:8081/ && break; sleep 1; done; "
              f"echo short=$(cat /tmp/page); echo svc=$(timeout 5 wget -q -O - http://web.{namespace}.svc:8081/)")
    for node in (a, b):
        client = f"client-{'a' if node is a else 'b'}"
        kube_client.create(_pod(client, namespace, node.name, script))
        log = _finished_log(kube_client, node, namespace, client, wait)
        print(f"\n[rig] {client} on {node.name}:\n{log}")
        # the kubelet's resolv.conf for a ClusterFirst pod: our clusterDNS, the cluster domain's search list
        assert f"nameserver {DNS_IP}" in log
        assert re.search(rf"search {namespace}\.svc\.cluster\.local svc\.cluster\.local cluster\.local", log), log
        assert re.search(rf"Name:\s+{re.escape(full)}\s+Address:\s+{re.escape(cluster_ip)}", log), log
        assert f"can't find nosuch.{namespace}.svc.cluster.local: NXDOMAIN" in log, log
        assert "short=hello-from-web" in log and "svc=hello-from-web" in log, log

    # no endpoint left: the node's view drops it within a refresh, and a connection to the ClusterIP is closed
    services_log = b.kubelet.layout.dir / "logs" / "node-services.log"
    probe = "timeout 5 wget -q -O - http://web:8081/ && echo reached || echo unreachable"
    kube_client.delete(Pod, "web", namespace=namespace, grace_period=0)
    kube_client.create(_pod("client-no-endpoint", namespace, b.name, f"sleep 6; {probe}"))
    log = _finished_log(kube_client, b, namespace, "client-no-endpoint", wait)
    assert re.search(r"^unreachable$", log, re.M) and not re.search(r"^reached$", log, re.M), log
    assert f"{cluster_ip}:8081 ({namespace}/web:http): no ready endpoint reachable of 0" in services_log.read_text()

    # the Service gone: its name is NXDOMAIN and its ClusterIP port is no longer served
    kube_client.delete(Service, "web", namespace=namespace)
    kube_client.create(_pod("client-no-service", namespace, b.name, f"sleep 4; nslookup {full}; {probe}"))
    log = _finished_log(kube_client, b, namespace, "client-no-service", wait)
    assert f"can't find {full}: NXDOMAIN" in log and re.search(r"^unreachable$", log, re.M), log
    assert f"- {cluster_ip}:8081" in services_log.read_text()
