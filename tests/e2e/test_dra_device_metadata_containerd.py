"""Device metadata (KEP-5304) read by the workload itself, inside a real containerd + runc container, from both DRA
drivers installed by their charts (``draDriver.deviceMetadata.enabled``, on by default):

- a claim the pod spec names (``resourceClaimName``) is found at
  ``/var/run/kubernetes.io/dra-device-attributes/resourceclaims/<claim>/<request>/<driver>-metadata.json``;
- a claim made from a template at ``.../resourceclaimtemplates/<pod claim name>/<request>/<driver>-metadata.json``.

Paths and the format (a JSON stream, ``metadata.resource.k8s.io/v1beta1`` first) are Kubernetes'
(k8s.io/dynamic-resource-allocation v0.37.2 ``api/metadata/doc.go``); the devices must be the ones the scheduler
allocated (the claim's ``status.allocation``) with the attributes their ResourceSlice publishes, plus what only the
node knows at prepare time.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from accel_rig.controlplane import ControlPlane
from accel_rig.nodelayout import CONTAINERD
from chart_render import EFA_CHART, NEURON_CHART, SEED_DRA_INSTALL
from conftest import RealNode
from lightkube import Client
from lightkube.resources.core_v1 import Event, Pod
from lightkube.resources.resource_v1 import ResourceClaim, ResourceSlice
from runtime_helpers import BUSYBOX, Helm, applied, rig_flags

pytestmark = pytest.mark.containerd

Wait = Callable[..., Any]
NodeFactory = Callable[..., RealNode]
BASE = "/var/run/kubernetes.io/dra-device-attributes"
#: Each metadata file the container finds, framed so the test can split them; then it waits to be deleted.
CAT = (f"for f in $(find {BASE} -type f | sort); do echo \"=== $f\"; cat \"$f\"; done; "
       "echo ---end; exec sleep 3600")


@pytest.fixture
def helm(control_plane: ControlPlane, tmp_path: Path) -> Helm:
    return Helm(control_plane, tmp_path)


@pytest.fixture
def trn2_both(kubelet_node: NodeFactory, kube_client: Client, helm: Helm, wait: Wait) -> Iterator[RealNode]:
    """A trn2.48xlarge containerd node with the Neuron DRA driver (the seed's command) and the EFA DRA driver."""
    trn2 = kubelet_node("trn2.48xlarge", runtime=CONTAINERD)
    helm.seed(SEED_DRA_INSTALL, NEURON_CHART, *rig_flags(trn2.kubelet))
    helm("upgrade", "--install", "aws-efa-k8s-device-plugin", str(EFA_CHART), "--namespace", "kube-system",
         "--set", "devicePlugin.enabled=false", "--set", "draDriver.enabled=true", *rig_flags(trn2.kubelet))
    try:
        wait(lambda: _published(kube_client, trn2.name, "neuron.aws.com")
             and _published(kube_client, trn2.name, "efa.aws.com"), "Neuron and EFA slices", timeout=180)
        yield trn2
    finally:
        for release, ns in (("aws-efa-k8s-device-plugin", "kube-system"), ("neuron-helm-chart", "neuron-dra-driver")):
            with contextlib.suppress(AssertionError):
                helm("uninstall", release, "--namespace", ns, "--wait", "--timeout", "120s")


def _published(client: Client, node: str, driver: str) -> dict[str, dict[str, Any]]:
    """Device name -> its published attributes, qualified as the metadata file qualifies them (as published)."""
    out: dict[str, dict[str, Any]] = {}
    for s in client.list(ResourceSlice):
        if s.spec.nodeName == node and s.spec.driver == driver:
            for d in s.to_dict()["spec"].get("devices", []):
                out[d["name"]] = d.get("attributes", {})
    return out


def _files(text: str) -> dict[str, list[dict[str, Any]]]:
    """Path -> the JSON objects of that file's stream, in order."""
    out: dict[str, list[dict[str, Any]]] = {}
    for chunk in text.partition("---end")[0].split("=== ")[1:]:
        path, _, body = chunk.partition("\n")
        decoder, objs, at = json.JSONDecoder(), [], 0
        body = body.strip()
        while at < len(body):
            obj, at = decoder.raw_decode(body, at)
            objs.append(obj)
            while at < len(body) and body[at].isspace():
                at += 1
        out[path.strip()] = objs
    return out


def test_the_workload_reads_its_device_metadata(trn2_both: RealNode, kube_client: Client, namespace: str,
                                                wait: Wait) -> None:
    node = trn2_both.name
    claim = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": {"name": "two-neurons"},
             "spec": {"devices": {"requests": [{"name": "neurons", "exactly": {
                 "deviceClassName": "neuron.aws.com", "allocationMode": "ExactCount", "count": 2}}]}}}
    template = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate", "metadata": {"name": "one-efa"},
                "spec": {"spec": {"devices": {"requests": [{"name": "nic", "exactly": {
                    "deviceClassName": "efa.networking.k8s.aws", "allocationMode": "ExactCount", "count": 1}}]}}}}
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "reads-metadata"},
           "spec": {"nodeSelector": {"kubernetes.io/hostname": node}, "terminationGracePeriodSeconds": 1,
                    "resourceClaims": [{"name": "accel", "resourceClaimName": "two-neurons"},
                                       {"name": "fabric", "resourceClaimTemplateName": "one-efa"}],
                    "containers": [{"name": "app", "image": BUSYBOX, "imagePullPolicy": "Never",
                                    "command": ["sh", "-c", CAT],
                                    "resources": {"claims": [{"name": "accel"}, {"name": "fabric"}]}}]}}
    with applied(kube_client, namespace, [claim, template, pod]):
        try:
            text = wait(lambda: (t := trn2_both.kubelet.pod_log(namespace, "reads-metadata", "app")) and "---end" in t
                        and t, "the container's metadata listing", timeout=180)
        except TimeoutError as exc:
            events = [f"{e.reason}: {e.message}" for e in kube_client.list(Event, namespace=namespace)]
            status = kube_client.get(Pod, "reads-metadata", namespace=namespace).to_dict().get("status")
            raise AssertionError(f"{exc}; pod status {status}; events {events}") from None
        claims = {c.metadata.name: c for c in kube_client.list(ResourceClaim, namespace=namespace)}
        generated = next(c for n, c in claims.items() if n != "two-neurons")
        files = _files(text)
        neuron_path = f"{BASE}/resourceclaims/two-neurons/neurons/neuron.aws.com-metadata.json"
        efa_path = f"{BASE}/resourceclaimtemplates/fabric/nic/efa.aws.com-metadata.json"
        assert set(files) == {neuron_path, efa_path}, text

        neuron_slices, efa_slices = _published(kube_client, node, "neuron.aws.com"), _published(kube_client, node,
                                                                                                "efa.aws.com")
        for path, claim_obj, driver, published, pod_claim in (
                (neuron_path, claims["two-neurons"], "neuron.aws.com", neuron_slices, None),
                (efa_path, generated, "efa.aws.com", efa_slices, "fabric")):
            stream = files[path]
            assert [o["apiVersion"] for o in stream][0] == "metadata.resource.k8s.io/v1beta1", stream
            doc = stream[0]
            assert doc["kind"] == "DeviceMetadata"
            assert doc["metadata"]["name"] == claim_obj.metadata.name
            assert doc["metadata"]["uid"] == claim_obj.metadata.uid
            assert doc.get("podClaimName") == pod_claim
            allocated = sorted(r.device for r in claim_obj.status.allocation.devices.results if r.driver == driver)
            (request,) = doc["requests"]
            assert sorted(d["name"] for d in request["devices"]) == allocated
            for device in request["devices"]:
                assert device["driver"] == driver and device["pool"] == node
                attributes = device["attributes"]
                # what the slice publishes for the device is all there, with the same values
                assert {k: v for k, v in attributes.items() if k in published[device["name"]]} \
                    == published[device["name"]], (device["name"], attributes)
                if driver == "neuron.aws.com":
                    # the cores the container sees on the device, as NEURON_RT_VISIBLE_CORES numbers them by default
                    # (the container's devices renumbered from 0 in index order), 4 logical cores per Trainium2
                    # device at the default LNC 2
                    rank = sorted(allocated, key=lambda n: int(n.rsplit("-", 1)[1])).index(device["name"])
                    assert attributes["visibleCores"] == {"string": f"{rank * 4}-{rank * 4 + 3}"}, attributes
                    assert attributes["logicalNeuronCore"] == {"int": 2}
                else:
                    uverbs = published[device["name"]]["uverbs"]["string"]
                    assert attributes["uverbsDevice"] == {"string": f"/dev/infiniband/{uverbs}"}, attributes
