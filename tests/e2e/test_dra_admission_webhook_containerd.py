"""The Neuron chart's admission webhook as installed: the seed's DRA install plus
``draDriver.admissionWebhook.enabled=true`` on a containerd node runs the project image's ``neuron-dra-driver
webhook`` as the chart's Deployment (an unprivileged user, read-only root, the chart-made certificate), the
kubelet's HTTPS readiness probe passes, and a review sent through the Service answers with the driver's line over
TLS that verifies against the configuration's caBundle for the Service's DNS name, as the API server checks it.

The rig's API server reaches pods through its egress proxy, but not Service ClusterIPs, so the review goes through
``kubectl port-forward`` to the Service; the configuration's own path from the API server is exercised with a URL in
tests/e2e/test_dra_admission_webhook_e2e.py.
"""

from __future__ import annotations

import base64
import json
import socket
import ssl
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from accel_rig.controlplane import ControlPlane
from accel_rig.nodelayout import CONTAINERD
from chart_render import NEURON_CHART, SEED_DRA_INSTALL
from conftest import RealNode
from lightkube import Client
from lightkube.resources.admissionregistration_v1 import ValidatingWebhookConfiguration
from lightkube.resources.apps_v1 import Deployment
from lightkube.resources.core_v1 import Secret
from runtime_helpers import Helm, chart_image, pods_of, port_forward, rig_flags

pytestmark = pytest.mark.containerd

NS = "neuron-dra-driver"
NAME = "neuron-dra-driver-admission-webhook"
Wait = Callable[..., Any]


def kubectl(control_plane: ControlPlane) -> Callable[..., subprocess.Popen[str]]:
    def start(*args: str) -> subprocess.Popen[str]:
        return subprocess.Popen([str(control_plane.kubectl), "--kubeconfig", str(control_plane.admin_kubeconfig),
                                 *args], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    return start


def post_review(port: int, ca: bytes, server_name: str, review: dict[str, Any]) -> dict[str, Any]:
    """POST /validate over TLS checked as the API server checks it: against ``ca``, for ``server_name``."""
    ctx = ssl.create_default_context(cadata=ca.decode())
    body = json.dumps(review).encode()
    with socket.create_connection(("127.0.0.1", port), timeout=20) as raw, \
            ctx.wrap_socket(raw, server_hostname=server_name) as tls:
        tls.sendall(b"POST /validate HTTP/1.1\r\nHost: " + server_name.encode() + b"\r\nContent-Type: "
                    b"application/json\r\nConnection: close\r\nContent-Length: " + str(len(body)).encode()
                    + b"\r\n\r\n" + body)
        data = b""
        while chunk := tls.recv(65536):
            data += chunk
    head, _, payload = data.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200"), head
    return dict(json.loads(payload))


def lnc3_template_review() -> dict[str, Any]:
    template = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
                "metadata": {"name": "lnc3", "namespace": "default"},
                "spec": {"spec": {"devices": {
                    "requests": [{"name": "neuron", "exactly": {"deviceClassName": "neuron.aws.com"}}],
                    "config": [{"requests": ["neuron"], "opaque": {"driver": "neuron.aws.com", "parameters": {
                        "apiVersion": "neuron.aws.com/v1", "kind": "NeuronConfig", "logicalNeuronCore": 3}}}]}}}}
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {
        "uid": "0d4c1f9e-8a51-4b8e-9d7a-3c2f7e1b6a10",
        "kind": {"group": "resource.k8s.io", "version": "v1", "kind": "ResourceClaimTemplate"},
        "resource": {"group": "resource.k8s.io", "version": "v1", "resource": "resourceclaimtemplates"},
        "namespace": "default", "name": "lnc3", "operation": "CREATE", "object": template}}


def test_the_charts_webhook_pod_answers_with_the_drivers_line(kubelet_node: Callable[..., RealNode],
                                                              kube_client: Client, control_plane: ControlPlane,
                                                              tmp_path: Path, wait: Wait) -> None:
    trn2 = kubelet_node("trn2.48xlarge", runtime=CONTAINERD)
    helm = Helm(control_plane, tmp_path)
    helm.seed(SEED_DRA_INSTALL, NEURON_CHART, *rig_flags(trn2.kubelet), "--set",
              "draDriver.admissionWebhook.enabled=true")
    try:
        # the kubelet's readiness probe (HTTPS GET /healthz) passes: the image serves TLS with the chart's Secret
        wait(lambda: _ready(kube_client), f"{NAME} ready 1/1", timeout=180)
        (pod,) = pods_of(kube_client, NS, {"app.kubernetes.io/name": NAME})
        assert pod["spec"]["containers"][0]["image"] == chart_image()
        assert pod["spec"]["securityContext"]["runAsUser"] == 65532
        assert pod["status"]["containerStatuses"][0].get("restartCount", 0) == 0

        secret = kube_client.get(Secret, f"{NAME}-tls", namespace=NS).to_dict()
        ca = base64.b64decode(secret["data"]["ca.crt"])
        vwc = kube_client.get(ValidatingWebhookConfiguration, NAME).to_dict()
        (hook,) = vwc["webhooks"]
        assert base64.b64decode(hook["clientConfig"]["caBundle"]) == ca
        service = hook["clientConfig"]["service"]
        assert (service["name"], service["namespace"], service["port"]) == (NAME, NS, 443)

        with port_forward(kubectl(control_plane), NS, f"svc/{NAME}", 443) as local:
            answer = wait(lambda: _try_post(local, ca, f"{NAME}.{NS}.svc"), "a review through the Service",
                          timeout=60)
        assert answer["response"]["uid"] == "0d4c1f9e-8a51-4b8e-9d7a-3c2f7e1b6a10"
        assert answer["response"]["allowed"] is False
        assert answer["response"]["status"]["message"] == \
            "config[0] (FromClaim, requests neuron): logicalNeuronCore must be 1 or 2, got 3"
    finally:
        helm("uninstall", "neuron-helm-chart", "--namespace", NS, "--wait", "--timeout", "120s")


def _ready(client: Client) -> bool:
    status = client.get(Deployment, NAME, namespace=NS).status
    return status is not None and status.readyReplicas == 1


def _try_post(port: int, ca: bytes, server_name: str) -> dict[str, Any] | None:
    try:
        return post_review(port, ca, server_name, lnc3_template_review())
    except ssl.SSLCertVerificationError:  # the certificate itself is wrong: no point in waiting
        raise
    except OSError:  # port-forward still connecting
        return None
