"""The product wheel, built as `pip wheel .` builds it, holds only what runs on a node plus the fake-sysfs generator:
not the dev rig (a distribution of its own, rig/), and it requires nothing that only the rig or the tests use."""

from __future__ import annotations

import re
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]
PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())
RIG = tomllib.loads((REPO / "rig" / "pyproject.toml").read_text())


def _name(requirement: str) -> str:
    return re.split(r"[<>=!~\[ ;]", requirement, maxsplit=1)[0].lower()


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> zipfile.ZipFile:
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation",
                    "-w", str(out), str(REPO)], check=True, capture_output=True, timeout=300)
    (built,) = out.glob("aws_accel_agents-*.whl")
    return zipfile.ZipFile(built)


def test_the_wheel_carries_no_rig(wheel: zipfile.ZipFile) -> None:
    tops = {n.split("/", 1)[0] for n in wheel.namelist() if not n.split("/", 1)[0].endswith(".dist-info")}
    assert tops == {"accel_core", "efa_plugin", "neuron_dra"}, tops
    assert not [n for n in wheel.namelist() if "devtools" in n or "accel_rig" in n]
    assert "accel_core/fakehost/builder.py" in wheel.namelist(), "the fake-sysfs generator is a product feature"
    (entry_points,) = [n for n in wheel.namelist() if n.endswith(".dist-info/entry_points.txt")]
    scripts = wheel.read(entry_points).decode()
    for rig_script in RIG["project"]["scripts"]:
        assert f"{rig_script} =" not in scripts, rig_script


def test_the_wheel_requires_nothing_dev_only(wheel: zipfile.ZipFile) -> None:
    (metadata,) = [n for n in wheel.namelist() if n.endswith(".dist-info/METADATA")]
    required = {_name(line.split(":", 1)[1].strip()) for line in wheel.read(metadata).decode().splitlines()
                if line.startswith("Requires-Dist:") and "extra ==" not in line}
    dev = {_name(r) for r in PYPROJECT["project"]["optional-dependencies"]["dev"]}
    rig_only = {_name(r) for r in RIG["project"]["dependencies"]} - {"aws-accel-agents"}
    assert {"cryptography", "psutil"} <= rig_only
    assert required and not required & (dev | rig_only), sorted(required & (dev | rig_only))


def test_the_rig_wheel_carries_its_data_files(tmp_path: Path) -> None:
    """Installed from its wheel (not a checkout), the rig still finds the pod network's CNI plugin it copies onto
    each containerd node: it is package data, executable."""
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation",
                    "-w", str(tmp_path), str(REPO / "rig")], check=True, capture_output=True, timeout=300)
    (built,) = tmp_path.glob("aws_accel_agents_rig-*.whl")
    with zipfile.ZipFile(built) as rig:
        info = rig.getinfo("accel_rig/data/accel-veth")
        assert info.external_attr >> 16 & 0o111, "the CNI plugin lost its executable bit"
        assert rig.read(info).startswith(b"#!")
        assert not [n for n in rig.namelist() if n.startswith(("accel_core/", "efa_plugin/", "neuron_dra/"))]
