"""The project image `make image` built (the OCI archive in dist/image/, the one the containerd nodes import):
read layer by layer, as a scanner would. Nothing the daemons do not use is in it: no pip, no compiler, no perl; its
package listing names every Debian package and Python distribution with a version, for CVE checks."""

from __future__ import annotations

import contextlib
import gzip
import io
import json
import re
import tarfile
import tomllib
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from accel_rig.containerdnode import RuntimeBinaries
from runtime_helpers import REPO, chart_image

DEV_EXTRA: list[str] = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]["dev"]

pytestmark = pytest.mark.containerd


@contextlib.contextmanager
def _archive() -> Iterator[tuple[dict[str, Any], dict[str, Any], Callable[[str], bytes]]]:
    """The index entry and manifest of the archive, and a reader of its blobs by digest."""
    archive = RuntimeBinaries.default().images / "app-current" / "image.oci.tar"
    with tarfile.open(archive) as oci:
        def blob(digest: str) -> bytes:
            f = oci.extractfile("blobs/sha256/" + digest.split(":", 1)[1])
            assert f is not None
            return f.read()

        index = json.loads(oci.extractfile("index.json").read())  # type: ignore[union-attr]
        (entry,) = index["manifests"]
        yield entry, json.loads(blob(entry["digest"])), blob


def _image_files() -> tuple[dict[str, str], set[str]]:
    """The index annotations of the archive and the set of paths in its final filesystem (whiteouts applied)."""
    with _archive() as (entry, manifest, blob):
        paths: set[str] = set()
        for layer in manifest["layers"]:
            data = blob(layer["digest"])
            if layer["mediaType"].endswith("gzip"):
                data = gzip.decompress(data)
            with tarfile.open(fileobj=io.BytesIO(data)) as tar:
                for m in tar.getmembers():
                    name = m.name.removeprefix("./")
                    base = name.rsplit("/", 1)[-1]
                    if base.startswith(".wh."):
                        gone = name[: len(name) - len(base)] + base.removeprefix(".wh.")
                        paths = {p for p in paths if p != gone and not p.startswith(gone + "/")}
                    else:
                        paths.add(name)
    return entry.get("annotations", {}), paths


def test_image_sets_glibc_malloc_tunables() -> None:
    """The image's environment, as the OCI config records it for every container: glibc's per-thread caches off and
    two arenas (docs/benchmarks.md, "Kubelet restarts")."""
    with _archive() as (_, manifest, blob):
        config = json.loads(blob(manifest["config"]["digest"]))
    env = dict(item.split("=", 1) for item in config["config"]["Env"])
    assert env.get("GLIBC_TUNABLES") == "glibc.malloc.tcache_count=0:glibc.malloc.arena_max=2", env


def test_image_is_named_as_the_charts_default_and_holds_no_build_tools() -> None:
    annotations, paths = _image_files()
    assert chart_image() in annotations.values()
    for daemon in ("efa-device-plugin", "efa-dra-driver", "neuron-device-plugin", "neuron-dra-driver",
                   "neuron-scheduler-extender"):
        assert f"opt/venv/bin/{daemon}" in paths, daemon
    # No interpreter or tool the daemons do not run: perl, pip, a compiler or linker, apt.
    programs = {p.rsplit("/", 1)[-1] for p in paths if re.match(r"(usr/)?(s?bin|local/bin)/|opt/venv/bin/", p)}
    unwanted = {p for p in programs if re.fullmatch(r"perl[\d.]*|pip[\d.]*|g?cc(-\d+)?|c\+\+|ld|as|apt(-get)?", p)}
    assert not unwanted, sorted(unwanted)
    modules = [p for p in paths if re.search(r"site-packages/(pip|setuptools)(/|-)", p)]
    assert not modules, modules[:5]
    assert not [p for p in paths if p.startswith("usr/lib/gcc/")], "a compiler's libexec is in the image"
    for dev_only in ("accel_core/fakehost/", "efa_plugin/fakehost.py", "neuron_dra/fakehost.py",
                     "site-packages/accel_rig/", "site-packages/cryptography/",
                     "opt/venv/bin/accel-demo", "opt/venv/bin/accel-cluster"):
        assert not [p for p in paths if dev_only in p], dev_only


def test_listing_names_every_package_with_a_version() -> None:
    listing = (REPO / "dist" / "image" / "aws-accel-agents-0.1.0.packages.txt").read_text().splitlines()
    debs = [line.split() for line in listing if line.startswith("deb ")]
    pys = {line.split()[1].lower(): line.split()[2] for line in listing if line.startswith("py ")}
    assert len(debs) > 20 and all(len(d) == 3 and d[2] for d in debs)
    assert {d[1] for d in debs} >= {"libc6", "python3.11-minimal", "libudev1", "libstdc++6"}
    assert not {d[1] for d in debs} & {"perl", "perl-base", "python3-pip", "gcc"}
    assert pys["aws-accel-agents"] == "0.1.0" and "grpcio" in pys and "pip" not in pys
    # neither the rig's distribution nor anything only the rig or the tests use (pyproject's dev extra)
    dev = {re.split(r"[<>=\[ ;]", d, maxsplit=1)[0].lower() for d in DEV_EXTRA}
    assert not set(pys) & (dev | {"aws-accel-agents-rig", "cryptography"}), sorted(set(pys) & dev)
