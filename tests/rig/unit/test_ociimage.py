"""The OCI image-layout archives the rig imports into containerd: checked against the OCI image spec v1.1 (media
types, content addressing by SHA-256 of each blob, the config's diff IDs as SHA-256 of the uncompressed layers)."""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import tarfile
from pathlib import Path

import pytest
from accel_rig.ociimage import Entry, ImageConfig, busybox_entries, write_layer, write_oci_archive


def _members(archive: Path) -> dict[str, bytes]:
    with tarfile.open(archive) as tar:
        return {m.name: tar.extractfile(m).read() for m in tar.getmembers() if m.isfile()}  # type: ignore[union-attr]


def _blob(members: dict[str, bytes], digest: str) -> bytes:
    algo, _, hexdigest = digest.partition(":")
    assert algo == "sha256"
    data = members[f"blobs/sha256/{hexdigest}"]
    assert hashlib.sha256(data).hexdigest() == hexdigest, f"blob {digest} does not hash to its name"
    return data


def test_archive_is_a_content_addressed_oci_layout(tmp_path: Path) -> None:
    layer = write_layer(tmp_path / "l.tar", [Entry("bin"), Entry("bin/hello", b"#!/bin/sh\necho hi\n"),
                                             Entry("bin/hi", target="hello")])
    out = tmp_path / "img.oci.tar"
    digest = write_oci_archive(out, "example.local/hello:1", [layer], ImageConfig(cmd=("/bin/hello",)))
    members = _members(out)
    assert json.loads(members["oci-layout"]) == {"imageLayoutVersion": "1.0.0"}
    index = json.loads(members["index.json"])
    (entry,) = index["manifests"]
    assert entry["digest"] == digest
    assert entry["mediaType"] == "application/vnd.oci.image.manifest.v1+json"
    assert entry["annotations"]["io.containerd.image.name"] == "example.local/hello:1"
    assert entry["annotations"]["org.opencontainers.image.ref.name"] == "example.local/hello:1"
    manifest = json.loads(_blob(members, digest))
    assert manifest["schemaVersion"] == 2
    assert manifest["config"]["mediaType"] == "application/vnd.oci.image.config.v1+json"
    config = json.loads(_blob(members, manifest["config"]["digest"]))
    assert config["os"] == "linux" and config["architecture"] == "amd64"
    assert config["config"]["Cmd"] == ["/bin/hello"]
    (layer_desc,) = manifest["layers"]
    assert layer_desc["mediaType"] == "application/vnd.oci.image.layer.v1.tar+gzip"
    compressed = _blob(members, layer_desc["digest"])
    assert layer_desc["size"] == len(compressed)
    uncompressed = gzip.decompress(compressed)
    assert config["rootfs"] == {"type": "layers", "diff_ids": ["sha256:" + hashlib.sha256(uncompressed).hexdigest()]}
    with tarfile.open(fileobj=io.BytesIO(uncompressed)) as tar:
        hi = tar.getmember("bin/hi")
        assert hi.issym() and hi.linkname == "hello"
        assert tar.extractfile("bin/hello").read() == b"#!/bin/sh\necho hi\n"  # type: ignore[union-attr]


def test_busybox_userland_links_each_applet_to_the_binary(tmp_path: Path) -> None:
    binary = tmp_path / "busybox"
    binary.write_bytes(b"\x7fELF-not-really")
    entries = {e.path: e for e in busybox_entries(binary)}
    assert entries["bin/busybox"].data == binary.read_bytes()
    for applet in ("sh", "ls", "env", "sleep"):  # what the workloads of the containerd tests run
        assert entries[f"bin/{applet}"].target == "busybox"
    assert entries["etc/passwd"].data is not None and entries["etc/passwd"].data.startswith(b"root:x:0:0:")


def test_an_image_needs_a_layer(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="no layers"):
        write_oci_archive(tmp_path / "x.tar", "example.local/x:1", [], ImageConfig())
