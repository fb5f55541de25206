"""Device metadata files (KEP-5304) as Kubernetes' kubelet-plugin helper lays them out. Expected paths and shapes are
the helper's, from k8s.io/dynamic-resource-allocation v0.37.2: ``api/metadata/doc.go`` (container paths), the
constants of ``api/metadata/types.go`` and ``kubeletplugin/metadata.go`` (host layout, modes), and the field names of
``api/metadata/v1beta1/types.go`` (as in its ``testdata/HEAD/metadata.json``)."""

from __future__ import annotations

import json
import stat
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from accel_core.dra.metadata import ClaimIdentity, MetadataDevice, MetadataFiles
from accel_core.dra.slicemodel import Version


def read_stream(text: str) -> list[dict[str, object]]:
    """A concatenated JSON stream, read the way Go's json.Decoder reads it: object after object."""
    decoder, out, at = json.JSONDecoder(), [], 0
    while at < len(text):
        while at < len(text) and text[at].isspace():
            at += 1
        if at == len(text):
            break
        obj, at = decoder.raw_decode(text, at)
        out.append(obj)
    return out


def test_a_claim_named_in_the_pod_spec(tmp_path: Path) -> None:
    files = MetadataFiles("neuron.aws.com", tmp_path / "plugins" / "neuron.aws.com")
    claim = ClaimIdentity.of("team-a", "my-claim", "uid-1", {})
    mount = files.write(claim, "neurons", [MetadataDevice("node-a", "neuron-3", {
        "instanceType": "trn2.48xlarge", "resource.kubernetes.io/numaNode": 1, "lnc": 2,
        "driverVersion": Version("2.21.0")})])
    host = tmp_path / "plugins/neuron.aws.com/dra-device-metadata/team-a_my-claim/neurons/metadata.json"
    assert mount.host_path == str(host) and mount.read_only
    assert mount.container_path == ("/var/run/kubernetes.io/dra-device-attributes/resourceclaims/my-claim/neurons/"
                                    "neuron.aws.com-metadata.json")
    assert stat.S_IMODE(host.stat().st_mode) == 0o644 and stat.S_IMODE(host.parent.stat().st_mode) == 0o755
    newest, older = read_stream(host.read_text())
    assert newest["apiVersion"] == "metadata.resource.k8s.io/v1beta1" and newest["kind"] == "DeviceMetadata"
    assert older["apiVersion"] == "metadata.resource.k8s.io/v1alpha1"
    assert {**older, "apiVersion": ""} == {**newest, "apiVersion": ""}
    assert newest["metadata"] == {"name": "my-claim", "namespace": "team-a", "uid": "uid-1", "generation": 1}
    assert "podClaimName" not in newest
    (request,) = newest["requests"]  # type: ignore[misc]
    assert request == {"name": "neurons", "devices": [{
        "driver": "neuron.aws.com", "pool": "node-a", "name": "neuron-3",
        "attributes": {"driverVersion": {"version": "2.21.0"}, "instanceType": {"string": "trn2.48xlarge"},
                       "lnc": {"int": 2}, "resource.kubernetes.io/numaNode": {"int": 1}}}]}


def test_a_claim_made_from_a_template_is_found_by_its_pod_claim_name(tmp_path: Path) -> None:
    files = MetadataFiles("efa.aws.com", tmp_path / "efa.aws.com")
    claim = ClaimIdentity.of("default", "pod-1-efa-x7k2q", "uid-2", {"resource.kubernetes.io/pod-claim-name": "efa"})
    mount = files.write(claim, "nics/fast", [MetadataDevice("n", "efa-0", {})])
    # the path keeps the request alone, the document the request/subrequest the allocator chose
    assert mount.container_path == ("/var/run/kubernetes.io/dra-device-attributes/resourceclaimtemplates/efa/nics/"
                                    "efa.aws.com-metadata.json")
    assert mount.host_path.endswith("/dra-device-metadata/default_pod-1-efa-x7k2q/nics/metadata.json")
    (doc, _) = read_stream(Path(mount.host_path).read_text())
    assert doc["podClaimName"] == "efa"
    assert doc["requests"] == [{"name": "nics/fast", "devices": [{"driver": "efa.aws.com", "pool": "n",
                                                                   "name": "efa-0"}]}]


def test_remove_takes_the_claims_files_and_nothing_else(tmp_path: Path) -> None:
    files = MetadataFiles("efa.aws.com", tmp_path)
    a, b = ClaimIdentity("ns", "a", "1"), ClaimIdentity("ns", "b", "2")
    files.write(a, "r", [])
    kept = files.write(b, "r", [])
    files.remove("ns", "a")
    files.remove("ns", "never-prepared")
    assert not files.claim_dir(a).exists() and Path(kept.host_path).exists()


@given(st.text(max_size=80))
def test_a_hostile_pod_claim_annotation_never_becomes_a_path(annotation: str) -> None:
    claim = ClaimIdentity.of("ns", "c", "u", {"resource.kubernetes.io/pod-claim-name": annotation})
    path = MetadataFiles("efa.aws.com", Path("/x")).container_file(claim, "r")
    assert ".." not in path.split("/") and path.count("/") == 8
    if claim.pod_claim_name is None:
        assert "/resourceclaims/c/" in path


def test_at_most_32_attributes_per_device(tmp_path: Path) -> None:
    """api/metadata/v1beta1: ``+k8s:maxProperties=32`` on a device's attributes."""
    files = MetadataFiles("efa.aws.com", tmp_path)
    doc = json.loads(files.document(ClaimIdentity("ns", "c", "u"), "r",
                                    [MetadataDevice("p", "d", {f"a{i:02}": i for i in range(40)})]).split("\n}\n")[0]
                     + "\n}")
    assert len(doc["requests"][0]["devices"][0]["attributes"]) == 32


def test_driver_name_must_be_a_dns_subdomain(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="DNS subdomain"):
        MetadataFiles("../etc", tmp_path)
