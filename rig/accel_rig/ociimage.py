"""OCI image-layout archives written with the standard library, for the rig's containerd nodes (dev-only).

No registry is reachable here, so the small images the rig needs (a pause image, a busybox test image, the Debian
Python base of the project image, a kube-scheduler image of the cached binary) are written as OCI image-layout tars
that ``ctr images import`` and ``buildah pull oci-archive:`` both accept. The layout (OCI image spec v1.1):
``oci-layout``, ``index.json`` naming one manifest, and content-addressed ``blobs/sha256/<hex>`` for the config, the
manifest and each gzip layer. The image name travels in two annotations of the index entry:
``io.containerd.image.name`` (what containerd names the imported image) and ``org.opencontainers.image.ref.name``.
An image known by more names (``--alias``: the busybox the examples name) gets one index entry per name, all
pointing at the same manifest.

``python -m accel_rig.ociimage`` is the command line ``scripts/build-images.sh`` uses.
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import io
import json
import shutil
import sys
import tarfile
import tempfile
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

MANIFEST_TYPE = "application/vnd.oci.image.manifest.v1+json"
CONFIG_TYPE = "application/vnd.oci.image.config.v1+json"
LAYER_TYPE = "application/vnd.oci.image.layer.v1.tar+gzip"
NAME_ANNOTATION = "io.containerd.image.name"
REF_ANNOTATION = "org.opencontainers.image.ref.name"
#: Busybox applets the test image links (what the tests and the demo run inside a container).
BUSYBOX_APPLETS = ("sh", "ls", "cat", "env", "sleep", "echo", "grep", "sort", "head", "tail", "wc", "id", "stat",
                   "readlink", "true", "false", "test", "mkdir", "rm", "date", "printf", "tr", "cut", "find", "xargs")


@dataclass(frozen=True)
class ImageConfig:
    """The runtime part of an image config (``config`` in the OCI config JSON)."""

    cmd: Sequence[str] = ()
    entrypoint: Sequence[str] = ()
    env: Sequence[str] = ("PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",)
    workdir: str = "/"
    labels: Mapping[str, str] = field(default_factory=dict)

    def as_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"Env": list(self.env), "WorkingDir": self.workdir}
        if self.cmd:
            out["Cmd"] = list(self.cmd)
        if self.entrypoint:
            out["Entrypoint"] = list(self.entrypoint)
        if self.labels:
            out["Labels"] = dict(self.labels)
        return out


def _sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


class _Blobs:
    """Content-addressed blobs in a scratch directory, later packed into the archive."""

    def __init__(self, root: Path) -> None:
        self.dir = root / "blobs" / "sha256"
        self.dir.mkdir(parents=True)

    def add_bytes(self, data: bytes, media_type: str) -> dict[str, Any]:
        hexdigest = hashlib.sha256(data).hexdigest()
        (self.dir / hexdigest).write_bytes(data)
        return {"mediaType": media_type, "digest": f"sha256:{hexdigest}", "size": len(data)}

    def add_layer(self, tar_path: Path) -> tuple[dict[str, Any], str]:
        """Gzip an uncompressed layer tar into a blob; return its descriptor and its diff ID."""
        diff_id = _sha256_file(tar_path)
        tmp = self.dir / "layer.tmp"
        with tar_path.open("rb") as src, tmp.open("wb") as raw, gzip.GzipFile(
                fileobj=raw, mode="wb", compresslevel=1, mtime=0) as gz:
            shutil.copyfileobj(src, gz, 1 << 20)
        hexdigest = _sha256_file(tmp)
        size = tmp.stat().st_size
        tmp.rename(self.dir / hexdigest)
        return {"mediaType": LAYER_TYPE, "digest": f"sha256:{hexdigest}", "size": size}, f"sha256:{diff_id}"


def write_oci_archive(out: Path, name: str, layers: Sequence[Path], config: ImageConfig,
                      aliases: Sequence[str] = ()) -> str:
    """Write ``out`` (an OCI image-layout tar) of one linux/amd64 image ``name`` (and ``aliases``, more names of the
    same manifest) made of the uncompressed layer tars ``layers`` (lowest first). Return the manifest digest."""
    if not layers:
        raise ValueError(f"image {name}: no layers")
    with tempfile.TemporaryDirectory(prefix="oci-", dir=out.parent) as scratch:
        root = Path(scratch)
        blobs = _Blobs(root)
        descriptors, diff_ids = zip(*(blobs.add_layer(layer) for layer in layers), strict=True)
        image_config = {
            "architecture": "amd64",
            "os": "linux",
            "config": config.as_json(),
            "rootfs": {"type": "layers", "diff_ids": list(diff_ids)},
            "history": [{"created_by": f"accel_rig.ociimage: layer {i}"} for i in range(len(layers))],
        }
        config_desc = blobs.add_bytes(json.dumps(image_config, sort_keys=True).encode(), CONFIG_TYPE)
        manifest = {"schemaVersion": 2, "mediaType": MANIFEST_TYPE, "config": config_desc,
                    "layers": list(descriptors)}
        manifest_desc = blobs.add_bytes(json.dumps(manifest, sort_keys=True).encode(), MANIFEST_TYPE)
        index = {"schemaVersion": 2, "mediaType": "application/vnd.oci.image.index.v1+json",
                 "manifests": [{**manifest_desc, "platform": {"architecture": "amd64", "os": "linux"},
                                "annotations": {NAME_ANNOTATION: n, REF_ANNOTATION: n}}
                               for n in dict.fromkeys((name, *aliases))]}
        (root / "index.json").write_text(json.dumps(index, sort_keys=True))
        (root / "oci-layout").write_text(json.dumps({"imageLayoutVersion": "1.0.0"}))
        tmp_out = out.with_name(out.name + ".tmp")
        with tarfile.open(tmp_out, "w") as tar:
            for entry in ("oci-layout", "index.json", "blobs"):
                tar.add(root / entry, arcname=entry)
        tmp_out.replace(out)
        return str(manifest_desc["digest"])


@dataclass(frozen=True)
class Entry:
    """One member of a layer tar built in memory: a file (``data``), a directory, or a symlink (``target``)."""

    path: str
    data: bytes | None = None
    mode: int = 0o755
    target: str | None = None


def write_layer(out: Path, entries: Iterable[Entry]) -> Path:
    """Write an uncompressed layer tar of ``entries`` (owned by root, mtime 0) to ``out``."""
    with tarfile.open(out, "w", format=tarfile.PAX_FORMAT) as tar:
        for e in entries:
            info = tarfile.TarInfo(e.path.lstrip("/"))
            info.mtime = 0
            info.mode = e.mode
            if e.target is not None:
                info.type, info.linkname, info.mode = tarfile.SYMTYPE, e.target, 0o777
                tar.addfile(info)
            elif e.data is None:
                info.type = tarfile.DIRTYPE
                tar.addfile(info)
            else:
                info.size = len(e.data)
                tar.addfile(info, io.BytesIO(e.data))
    return out


_PASSWD = b"root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/bin/false\n"
_GROUP = b"root:x:0:\nnogroup:x:65534:\n"


def busybox_entries(busybox: Path) -> list[Entry]:
    """A busybox userland: ``/bin/busybox`` (static), one symlink per applet, ``/etc/passwd`` and ``/etc/group``."""
    entries = [Entry("bin"), Entry("etc"), Entry("tmp", mode=0o1777), Entry("bin/busybox", busybox.read_bytes())]
    entries += [Entry(f"bin/{applet}", target="busybox") for applet in BUSYBOX_APPLETS]
    entries += [Entry("etc/passwd", _PASSWD, 0o644), Entry("etc/group", _GROUP, 0o644)]
    return entries


def static_binary_entries(binary: Path, at: str) -> list[Entry]:
    """A static binary at ``at`` (e.g. ``/usr/local/bin/kube-scheduler``) with its parent directories, a writable
    ``/tmp``, and ``/etc/passwd`` and ``/etc/group`` naming root, nobody and the unprivileged user 65532."""
    parts = at.strip("/").split("/")
    if len(parts) < 2 or parts[0] in ("etc", "tmp"):
        raise ValueError(f"{at}: a static binary goes in a directory other than /etc and /tmp")
    entries = [Entry("/".join(parts[:i])) for i in range(1, len(parts))]
    entries += [Entry("/".join(parts), binary.read_bytes()), Entry("tmp", mode=0o1777), Entry("etc"),
                Entry("etc/passwd", _PASSWD + b"nonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n", 0o644),
                Entry("etc/group", _GROUP + b"nonroot:x:65532:\n", 0o644)]
    return entries


def _main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m accel_rig.ociimage", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="kind", required=True)
    pause = sub.add_parser("pause", help="a pause image from a static pause binary")
    pause.add_argument("binary", type=Path)
    busybox = sub.add_parser("busybox", help="a busybox test image from a static busybox binary")
    busybox.add_argument("binary", type=Path)
    rootfs = sub.add_parser("rootfs", help="an image of one rootfs tar (the Debian Python base)")
    rootfs.add_argument("tar", type=Path)
    rootfs.add_argument("--env", action="append", default=[])
    rootfs.add_argument("--label", action="append", default=[], help="KEY=VALUE")
    static = sub.add_parser("static", help="an image of one static binary (the cached kube-scheduler)")
    static.add_argument("binary", type=Path)
    static.add_argument("--at", required=True, help="its path in the image (its entrypoint)")
    for p in (pause, busybox, rootfs, static):
        p.add_argument("--name", required=True, help="the image reference, e.g. example.local/busybox:1.35")
        p.add_argument("--alias", action="append", default=[], help="another reference of the same image")
        p.add_argument("--out", required=True, type=Path)
    args = parser.parse_args(argv)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="layer-", dir=args.out.parent) as scratch:
        layer = Path(scratch) / "layer.tar"
        if args.kind == "pause":
            write_layer(layer, [Entry("pause", args.binary.read_bytes())])
            config = ImageConfig(entrypoint=("/pause",), env=())
        elif args.kind == "busybox":
            write_layer(layer, busybox_entries(args.binary))
            config = ImageConfig(cmd=("sh",), env=("PATH=/bin",))
        elif args.kind == "static":
            write_layer(layer, static_binary_entries(args.binary, args.at))
            config = ImageConfig(entrypoint=(args.at,))
        else:
            layer = args.tar
            labels = dict(item.split("=", 1) for item in args.label)
            config = ImageConfig(cmd=("python3",), env=(*ImageConfig().env, *args.env), labels=labels)
        digest = write_oci_archive(args.out, args.name, [layer], config, args.alias)
    print(f"{' '.join((args.name, *args.alias))} {digest} {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(_main())
