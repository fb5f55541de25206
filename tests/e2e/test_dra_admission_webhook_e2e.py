"""The drivers' admission webhooks against the real API server: ``kubectl apply`` of a ResourceClaimTemplate with
``logicalNeuronCore: 3`` or a misspelt field is refused with the line the driver's prepare would give, a good one
is accepted; a ResourceClaim and a DeviceClass are checked too; the same for EFA. And what happens while a webhook
is down, with either failurePolicy.

The webhooks run as processes on this machine (``neuron-dra-driver webhook``, ``efa-dra-driver webhook``) with a
certificate for 127.0.0.1; the ValidatingWebhookConfigurations are the charts' own (rendered with
``draDriver.admissionWebhook.enabled=true``: rules, matchConditions, failurePolicy), with ``clientConfig.url``
pointing at those processes in place of the in-cluster Service. Expected messages follow the drivers' documented
rules (LNC is 1 or 2; unknown fields refused; EfaConfig has no settings) and the API server's refusal format.
"""

from __future__ import annotations

import base64
import contextlib
import socket
import ssl
import subprocess
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from accel_rig.certs import issue, make_ca
from accel_rig.controlplane import ControlPlane
from chart_render import EFA_CHART, NEURON_CHART, find_or_build_helm, template
from lightkube import ApiError, Client, codecs
from lightkube.resources.admissionregistration_v1 import ValidatingWebhookConfiguration
from lightkube.resources.apps_v1 import Deployment
from lightkube.resources.core_v1 import Secret
from lightkube.resources.resource_v1 import DeviceClass
from runtime_helpers import Helm

NEURON_LNC_3 = "config[0] (FromClaim, requests neuron): logicalNeuronCore must be 1 or 2, got 3"
DENIED = 'admission webhook "opaque-configs.{driver}" denied the request: '


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def tls(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("webhook-tls")
    files = {name: d / name for name in ("ca.crt", "ca.key", "tls.crt", "tls.key")}
    make_ca(files["ca.crt"], files["ca.key"], "/CN=e2e-admission-webhook-ca", days=2)
    issue(files["ca.crt"], files["ca.key"], files["tls.crt"], files["tls.key"], "/CN=127.0.0.1", days=1,
          server_sans=["IP:127.0.0.1"])
    return files


def wait_healthy(port: int, ca: Path, timeout: float = 30.0) -> None:
    ctx = ssl.create_default_context(cafile=str(ca))
    deadline = time.monotonic() + timeout
    while True:
        try:
            with urllib.request.urlopen(f"https://127.0.0.1:{port}/healthz", context=ctx, timeout=2) as resp:
                if resp.status == 200:
                    return
        except OSError:
            if time.monotonic() > deadline:
                raise
        time.sleep(0.2)


def chart_webhook(chart: Path, *args: str) -> dict[str, Any]:
    rendered = template(find_or_build_helm(), chart, "--set", "devicePlugin.enabled=false", "--set",
                        "draDriver.enabled=true", "--set", "draDriver.admissionWebhook.enabled=true", *args)
    (vwc,) = rendered.all("ValidatingWebhookConfiguration")
    return dict(vwc)


@contextlib.contextmanager
def installed(client: Client, vwc: dict[str, Any], port: int, ca: Path, name: str) -> Iterator[None]:
    """The chart's configuration, calling https://127.0.0.1:PORT/validate instead of its Service."""
    vwc = {**vwc, "metadata": {**vwc["metadata"], "name": name}}
    for hook in vwc["webhooks"]:
        hook["clientConfig"] = {"url": f"https://127.0.0.1:{port}/validate",
                                "caBundle": base64.b64encode(ca.read_bytes()).decode()}
    client.create(codecs.from_dict(vwc))
    try:
        yield
    finally:
        with contextlib.suppress(ApiError):
            client.delete(ValidatingWebhookConfiguration, name)


def template_doc(name: str, namespace: str, driver: str, device_class: str, parameters: Any) -> dict[str, Any]:
    request = "neuron" if driver == "neuron.aws.com" else "efa"
    config = [{"requests": [request], "opaque": {"driver": driver, "parameters": parameters}}] \
        if driver == "neuron.aws.com" else [{"opaque": {"driver": driver, "parameters": parameters}}]
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {"spec": {"devices": {
                "requests": [{"name": request, "exactly": {"deviceClassName": device_class}}],
                **({"config": config} if parameters is not None else {})}}}}


def neuron_template(name: str, namespace: str, parameters: Any) -> dict[str, Any]:
    return template_doc(name, namespace, "neuron.aws.com", "neuron.aws.com", parameters)


def efa_template(name: str, namespace: str, parameters: Any) -> dict[str, Any]:
    return template_doc(name, namespace, "efa.aws.com", "efa.networking.k8s.aws", parameters)


def lnc(value: Any) -> dict[str, Any]:
    return {"apiVersion": "neuron.aws.com/v1", "kind": "NeuronConfig", "logicalNeuronCore": value}


Apply = Callable[[dict[str, Any]], subprocess.CompletedProcess[str]]


@pytest.fixture
def kubectl_apply(control_plane: ControlPlane, kube_binaries: Path, tmp_path: Path) -> Apply:
    def apply(doc: dict[str, Any]) -> subprocess.CompletedProcess[str]:
        path = tmp_path / f"{doc['metadata']['name']}.yaml"
        path.write_text(yaml.safe_dump(doc))
        return subprocess.run([str(kube_binaries / "kubectl"), "--kubeconfig", str(control_plane.admin_kubeconfig),
                               "apply", "-f", str(path)], capture_output=True, text=True, timeout=60, check=False)

    return apply


def refused_once_active(apply: Apply, doc: dict[str, Any], part: str, timeout: float = 30.0) -> str:
    """kubectl apply ``doc`` until it is refused (the API server picks up a new configuration within seconds;
    objects admitted before that are deleted again); returns kubectl's stderr."""
    deadline = time.monotonic() + timeout
    while True:
        proc = apply(doc)
        if proc.returncode != 0:
            assert part in proc.stderr, proc.stderr
            return proc.stderr
        subprocess.run([*proc.args[:-3], "delete", "-f", proc.args[-1], "--wait=false"], capture_output=True,
                       timeout=60, check=False)
        assert time.monotonic() < deadline, f"still admitted after {timeout} s: {proc.stdout}"
        time.sleep(0.5)


def test_kubectl_apply_refuses_bad_neuron_and_efa_configs_with_the_drivers_line(
        kube_client: Client, namespace: str, daemon: Callable[..., Any], tls: dict[str, Path],
        kubectl_apply: Apply) -> None:
    ports = {"neuron-dra-driver": free_port(), "efa-dra-driver": free_port()}
    for script, port in ports.items():
        daemon(script, "webhook", "--address", "127.0.0.1", "--port", str(port), "--tls-cert-file",
               str(tls["tls.crt"]), "--tls-key-file", str(tls["tls.key"]), env={})
    for port in ports.values():
        wait_healthy(port, tls["ca.crt"])
    neuron_vwc, efa_vwc = chart_webhook(NEURON_CHART), chart_webhook(EFA_CHART)
    assert neuron_vwc["webhooks"][0]["failurePolicy"] == "Ignore"  # the charts' default
    with installed(kube_client, neuron_vwc, ports["neuron-dra-driver"], tls["ca.crt"], f"{namespace}-neuron"), \
            installed(kube_client, efa_vwc, ports["efa-dra-driver"], tls["ca.crt"], f"{namespace}-efa"):
        err = refused_once_active(kubectl_apply, neuron_template("lnc3", namespace, lnc(3)), NEURON_LNC_3)
        assert DENIED.format(driver="neuron.aws.com") + NEURON_LNC_3 in err, err

        typo = {"apiVersion": "neuron.aws.com/v1", "kind": "NeuronConfig", "logicalNeuronCores": 2}
        proc = kubectl_apply(neuron_template("typo", namespace, typo))
        assert proc.returncode != 0
        assert (DENIED.format(driver="neuron.aws.com")
                + "config[0] (FromClaim, requests neuron): strict decoding error: unknown field 'logicalNeuronCores'"
                in proc.stderr), proc.stderr

        good = kubectl_apply(neuron_template("lnc2", namespace, lnc(2)))
        assert good.returncode == 0 and "created" in good.stdout, good.stderr

        # a ResourceClaim is checked as a template is
        claim = neuron_template("claim-lnc3", namespace, lnc(3))
        claim = {**claim, "kind": "ResourceClaim", "spec": claim["spec"]["spec"]}
        with pytest.raises(ApiError) as refused:
            kube_client.create(codecs.from_dict(claim))
        assert refused.value.status.code == 422 and NEURON_LNC_3 in (refused.value.status.message or "")

        # so is a DeviceClass's config (prepare applies it to every claim of the class, as FromClass)
        device_class = {"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass",
                        "metadata": {"name": f"{namespace}-lnc3"},
                        "spec": {"selectors": [{"cel": {"expression": "device.driver == 'neuron.aws.com'"}}],
                                 "config": [{"opaque": {"driver": "neuron.aws.com", "parameters": lnc(3)}}]}}
        try:
            with pytest.raises(ApiError) as refused:
                kube_client.create(codecs.from_dict(device_class))
        finally:
            with contextlib.suppress(ApiError):
                kube_client.delete(DeviceClass, f"{namespace}-lnc3")
        assert refused.value.status.message == \
            DENIED.format(driver="neuron.aws.com") + "config[0] (FromClass): logicalNeuronCore must be 1 or 2, got 3"

        efa_bad = {"apiVersion": "efa.aws.com/v1", "kind": "EfaConfig", "mtu": 9001}
        err = refused_once_active(kubectl_apply, efa_template("efa-typo", namespace, efa_bad), "unknown field 'mtu'")
        assert (DENIED.format(driver="efa.aws.com")
                + "config[0] (FromClaim): strict decoding error: unknown field 'mtu' (known: apiVersion, kind)"
                in err), err
        efa_good = kubectl_apply(efa_template("efa-good", namespace, {"apiVersion": "efa.aws.com/v1",
                                                                     "kind": "EfaConfig"}))
        assert efa_good.returncode == 0, efa_good.stderr


def test_while_the_webhook_is_down(kube_client: Client, namespace: str, daemon: Callable[..., Any],
                                   tls: dict[str, Path], kubectl_apply: Apply) -> None:
    """Ignore (the default): bad configs are admitted again (prepare still refuses them). Fail: no claim carrying
    a Neuron config is admitted, and claims without one never reach the webhook (matchConditions)."""
    port = free_port()
    hook = daemon("neuron-dra-driver", "webhook", "--address", "127.0.0.1", "--port", str(port), "--tls-cert-file",
                  str(tls["tls.crt"]), "--tls-key-file", str(tls["tls.key"]), env={})
    wait_healthy(port, tls["ca.crt"])
    vwc = chart_webhook(NEURON_CHART, "--set",
                        "draDriver.admissionWebhook.failurePolicy=Fail")
    assert vwc["webhooks"][0]["failurePolicy"] == "Fail"
    with installed(kube_client, vwc, port, tls["ca.crt"], f"{namespace}-neuron-fail"):
        refused_once_active(kubectl_apply, neuron_template("up", namespace, lnc(3)), NEURON_LNC_3)
        assert hook.stop() == 0
        down = kubectl_apply(neuron_template("down-good", namespace, lnc(2)))
        assert down.returncode != 0
        assert 'failed calling webhook "opaque-configs.neuron.aws.com"' in down.stderr, down.stderr
        plain = kubectl_apply(neuron_template("no-config", namespace, None))
        assert plain.returncode == 0, plain.stderr  # not sent: no neuron.aws.com config in it
        other = template_doc("other-driver", namespace, "gpu.example.com", "gpu.example.com", {"x": 1})
        assert kubectl_apply(other).returncode == 0
    ignore = chart_webhook(NEURON_CHART)
    with installed(kube_client, ignore, port, tls["ca.crt"], f"{namespace}-neuron-ignore"):
        time.sleep(3)  # the configuration is picked up within a few seconds; with Ignore there is nothing to wait on
        admitted = kubectl_apply(neuron_template("down-bad", namespace, lnc(3)))
        assert admitted.returncode == 0, admitted.stderr


def test_upgrades_keep_the_certificate_until_a_third_of_its_life_is_left(
        control_plane: ControlPlane, kube_client: Client, tmp_path: Path) -> None:
    """The chart's CA and serving certificate survive `helm upgrade` (lookup); once less than a third of their
    lifetime is left (the Secret's tls-not-after annotation) an upgrade makes new ones, the configuration's caBundle
    follows and the pods roll (their template's checksum changes)."""
    helm = Helm(control_plane, tmp_path)
    name, ns = "neuron-dra-driver-admission-webhook", "neuron-dra-driver"
    install = ("upgrade", "--install", "neuron-helm-chart", str(NEURON_CHART), "--namespace", ns, "--create-namespace",
               "--set", "devicePlugin.enabled=false", "--set", "npd.enabled=false", "--set", "draDriver.enabled=true",
               "--set", "draDriver.admissionWebhook.enabled=true",
               "--set", "draDriver.handoffOnUninstall=false")  # its pre-delete Job needs a node to run on

    def state() -> tuple[str, str, str]:
        secret = kube_client.get(Secret, f"{name}-tls", namespace=ns).to_dict()
        bundle = kube_client.get(ValidatingWebhookConfiguration, name).to_dict()["webhooks"][0]["clientConfig"]
        checksum = kube_client.get(Deployment, name, namespace=ns).to_dict()["spec"]["template"]["metadata"][
            "annotations"]["checksum/tls"]
        return secret["data"]["ca.crt"], bundle["caBundle"], checksum

    helm(*install)
    try:
        first = state()
        assert first[0] == first[1]
        helm(*install)
        assert state() == first  # kept
        now = int(time.time())
        kube_client.patch(Secret, f"{name}-tls", namespace=ns, obj={"metadata": {"annotations": {
            "accel-dra.aws/tls-not-before": str(now - 90 * 86400),
            "accel-dra.aws/tls-not-after": str(now + 20 * 86400)}}})
        helm(*install)
        renewed = state()
        assert renewed[0] == renewed[1] and renewed[0] != first[0] and renewed[2] != first[2]
    finally:
        helm("uninstall", "neuron-helm-chart", "--namespace", ns)
