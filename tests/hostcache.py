"""Fake hosts built once per test session and copied per test.

A trn2.48xlarge tree is ~12k files; generating it is several seconds under load, copying it with ``cp -a`` is a
fraction of that. Each (type, EFA, LNC) is generated once into the session's temp tree; every caller gets its own
copy to read or mutate, so no test sees another's changes.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

from accel_core.fakehost import FakeHost, build_host
from accel_core.paths import HostPaths

#: Set by the session fixture in tests/conftest.py; without it (outside pytest) every call generates a tree.
ROOT: Path | None = None
_BUILT: dict[tuple[str, bool, int | None], Path] = {}


def copy_host(dest: Path, instance_type: str, *, efa: bool = True, lnc: int | None = None) -> FakeHost:
    """Like :func:`build_host` (same arguments and result), from the session's pristine tree of that kind."""
    if ROOT is None:
        return build_host(dest, instance_type, efa=efa, lnc=lnc)
    key = (instance_type, efa, lnc)
    pristine = _BUILT.get(key)
    if pristine is None:
        pristine = ROOT / f"{instance_type}-efa{int(efa)}-lnc{lnc}"
        build_host(pristine, instance_type, efa=efa, lnc=lnc)
        _BUILT[key] = pristine
    dest.mkdir(parents=True, exist_ok=True)
    if any(dest.iterdir()):
        build_host(dest, instance_type, efa=efa, lnc=lnc)  # raises the builder's "already holds a tree" error
    subprocess.run(["cp", "-a", f"{pristine}/.", str(dest)], check=True)
    return FakeHost.attach(dest)


def own_paths(host: FakeHost) -> HostPaths:
    """The host's paths with the kubelet directories inside the fake tree too: nothing on the machine running the
    tests (a real kubelet's sockets under /var/lib/kubelet) can change the outcome."""
    return HostPaths(host_root=host.root, kubelet_root=host.root / "kubelet", device_plugins=host.root / "dp")
