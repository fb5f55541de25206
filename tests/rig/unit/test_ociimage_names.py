"""More names for one image and the static-binary image (the rig's kube-scheduler), against the OCI image spec v1.1:
an index may list one manifest several times, each entry naming it with its own ``io.containerd.image.name`` /
``org.opencontainers.image.ref.name``; a config's ``Entrypoint`` is what a container runs when the pod gives no
command."""

from __future__ import annotations

import gzip
import io
import json
import tarfile
from pathlib import Path

import pytest
from accel_rig.ociimage import (
    Entry,
    ImageConfig,
    _main,
    static_binary_entries,
    write_layer,
    write_oci_archive,
)


def _members(archive: Path) -> dict[str, bytes]:
    with tarfile.open(archive) as tar:
        return {m.name: tar.extractfile(m).read() for m in tar.getmembers() if m.isfile()}  # type: ignore[union-attr]


def test_aliases_name_the_same_manifest(tmp_path: Path) -> None:
    layer = write_layer(tmp_path / "l.tar", [Entry("bin")])
    out = tmp_path / "img.oci.tar"
    names = ["example.local/busybox:1.35", "public.ecr.aws/docker/library/busybox:latest"]
    digest = write_oci_archive(out, names[0], [layer], ImageConfig(), aliases=[names[1], names[0]])
    index = json.loads(_members(out)["index.json"])
    entries = index["manifests"]
    assert [e["annotations"]["io.containerd.image.name"] for e in entries] == names  # a repeated name only once
    assert [e["annotations"]["org.opencontainers.image.ref.name"] for e in entries] == names
    assert {e["digest"] for e in entries} == {digest}


def test_static_binary_image(tmp_path: Path) -> None:
    binary = tmp_path / "kube-scheduler"
    binary.write_bytes(b"\x7fELF-static")
    out = tmp_path / "ks.oci.tar"
    _main(["static", str(binary), "--at", "/usr/local/bin/kube-scheduler", "--name",
           "registry.k8s.io/kube-scheduler:v1.37.2", "--out", str(out)])
    members = _members(out)
    (entry,) = json.loads(members["index.json"])["manifests"]
    assert entry["annotations"]["io.containerd.image.name"] == "registry.k8s.io/kube-scheduler:v1.37.2"
    manifest = json.loads(members[f"blobs/sha256/{entry['digest'].split(':')[1]}"])
    config = json.loads(members[f"blobs/sha256/{manifest['config']['digest'].split(':')[1]}"])
    assert config["config"]["Entrypoint"] == ["/usr/local/bin/kube-scheduler"]
    assert "/usr/local/bin" in next(e for e in config["config"]["Env"] if e.startswith("PATH=")).split(":")
    (layer,) = manifest["layers"]
    data = gzip.decompress(members[f"blobs/sha256/{layer['digest'].split(':')[1]}"])
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        names = tar.getnames()
        ks = tar.getmember("usr/local/bin/kube-scheduler")
        assert ks.isfile() and ks.mode & 0o111 and tar.extractfile(ks).read() == b"\x7fELF-static"  # type: ignore[union-attr]
        # parents before children; /tmp writable by anyone (sticky), as a non-root user needs
        assert names.index("usr") < names.index("usr/local") < names.index("usr/local/bin") < names.index(
            "usr/local/bin/kube-scheduler")
        assert tar.getmember("tmp").mode == 0o1777
        passwd = tar.extractfile("etc/passwd").read().decode()  # type: ignore[union-attr]
    # the chart runs my-scheduler as uid 65532
    assert any(line.split(":")[2] == "65532" for line in passwd.splitlines())


def test_static_binary_needs_a_directory(tmp_path: Path) -> None:
    binary = tmp_path / "b"
    binary.write_bytes(b"x")
    with pytest.raises(ValueError, match="kube-scheduler"):
        static_binary_entries(binary, "/kube-scheduler")
