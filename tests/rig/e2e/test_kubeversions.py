"""The Python side finds the binaries where scripts/build-kube.sh puts them (same versions, same path rules)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
from accel_rig.controlplane import ControlPlane
from accel_rig.controlplane_errors import MissingBinariesError
from accel_rig.kubeversions import build_bin_dir, build_script, kube_bin_dir


def script_dir(env: dict[str, str]) -> Path:
    out = subprocess.run(
        ["bash", str(build_script()), "--print-dir"], env=env, capture_output=True, text=True, check=True, timeout=30
    )
    return Path(out.stdout.strip())


@pytest.mark.parametrize(
    "overrides",
    [
        {},
        {"XDG_CACHE_HOME": "/tmp/xdg-cache"},
        {"XDG_CACHE_HOME": ""},
        {"ACCEL_KUBE_CACHE": "/tmp/kube-cache", "KUBE_VERSION": "v1.99.0", "HELM_VERSION": "v3.0.1"},
    ],
)
def test_bin_dir_matches_build_script(overrides: dict[str, str]) -> None:
    base = {k: v for k, v in os.environ.items() if k not in ("ACCEL_KUBE_CACHE", "XDG_CACHE_HOME", "ACCEL_KUBE_BIN")}
    for key in ("KUBE_VERSION", "ETCD_VERSION", "HELM_VERSION"):
        base.pop(key, None)
    env = {**base, **overrides}
    assert build_bin_dir(env) == script_dir(env)
    assert kube_bin_dir({**env, "ACCEL_KUBE_BIN": "/opt/kube/bin"}) == Path("/opt/kube/bin")


def test_missing_binaries_error_says_how_to_build(tmp_path: Path) -> None:
    cp = ControlPlane(tmp_path / "state", bin_dir=tmp_path / "empty")
    with pytest.raises(MissingBinariesError) as err:
        cp.start()
    assert "build-kube.sh" in str(err.value) and "kube-apiserver" in str(err.value)
    assert "ACCEL_KUBE_BIN" in str(err.value)
