"""Pinned versions of the real Kubernetes parts the tests run, and where their binaries are cached.

The defaults and the directory layout mirror ``scripts/build-kube.sh`` (same environment variables,
same path), so ``kube_bin_dir()`` names the directory that ``scripts/build-kube.sh --print-dir`` prints.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

KUBE_VERSION = "v1.37.2"
ETCD_VERSION = "v3.7.0"
HELM_VERSION = "v3.22.0"

#: Binaries the build script produces; all must exist for a usable cache.
KUBE_BINARIES = (
    "kube-apiserver", "kube-scheduler", "kube-controller-manager", "kubectl", "kubelet", "etcd", "helm", "fakecri",
)

#: The build script, relative to the repository root.
BUILD_SCRIPT = Path("scripts") / "build-kube.sh"


@dataclass(frozen=True)
class KubeVersions:
    """The three upstream versions that name one build of the cache."""

    kube: str = KUBE_VERSION
    etcd: str = ETCD_VERSION
    helm: str = HELM_VERSION

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> KubeVersions:
        """Versions with the build script's overrides (KUBE_VERSION, ETCD_VERSION, HELM_VERSION) applied."""
        e = os.environ if env is None else env
        return cls(
            kube=e.get("KUBE_VERSION") or KUBE_VERSION,
            etcd=e.get("ETCD_VERSION") or ETCD_VERSION,
            helm=e.get("HELM_VERSION") or HELM_VERSION,
        )

    @property
    def build_name(self) -> str:
        """The cache sub-directory name, e.g. ``v1.37.2-etcdv3.7.0-helmv3.22.0``."""
        return f"{self.kube}-etcd{self.etcd}-helm{self.helm}"


def _nonempty(env: Mapping[str, str], key: str) -> str | None:
    value = env.get(key, "")
    return value or None


def cache_root(leaf: str, override: str, env: Mapping[str, str] | None = None) -> Path:
    """``$<override>``, else ``${XDG_CACHE_HOME:-~/.cache}/aws-accel-agents/<leaf>`` (as the build scripts do)."""
    e = os.environ if env is None else env
    explicit = _nonempty(e, override)
    if explicit:
        return Path(explicit)
    xdg = _nonempty(e, "XDG_CACHE_HOME")
    home = Path(_nonempty(e, "HOME") or Path.home())
    base = Path(xdg) if xdg else home / ".cache"
    return base / "aws-accel-agents" / leaf


def kube_cache_root(env: Mapping[str, str] | None = None) -> Path:
    """``$ACCEL_KUBE_CACHE``, else ``${XDG_CACHE_HOME:-~/.cache}/aws-accel-agents/kube``."""
    return cache_root("kube", "ACCEL_KUBE_CACHE", env)


def build_bin_dir(env: Mapping[str, str] | None = None) -> Path:
    """The directory ``scripts/build-kube.sh`` fills (ignores ``ACCEL_KUBE_BIN``)."""
    return kube_cache_root(env) / KubeVersions.from_env(env).build_name / "bin"


def kube_bin_dir(env: Mapping[str, str] | None = None) -> Path:
    """Where to find the binaries: ``$ACCEL_KUBE_BIN`` if set, else the build script's directory."""
    e = os.environ if env is None else env
    override = _nonempty(e, "ACCEL_KUBE_BIN")
    return Path(override) if override else build_bin_dir(e)


def missing_binaries(bin_dir: Path) -> list[str]:
    """Names from ``KUBE_BINARIES`` that are absent or not executable in ``bin_dir``."""
    return [b for b in KUBE_BINARIES if not os.access(bin_dir / b, os.X_OK)]


def repo_root() -> Path:
    """The source checkout this module lives in (``rig/accel_rig/`` is two levels down)."""
    return Path(__file__).resolve().parents[2]


def build_script() -> Path:
    """Absolute path of ``scripts/build-kube.sh`` in this checkout."""
    return repo_root() / BUILD_SCRIPT
