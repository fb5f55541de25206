"""The CDI oracle: ``tools/cdicheck``, which loads spec directories with upstream's
``tags.cncf.io/container-device-interface`` ``pkg/cdi`` (the library containerd injects CDI devices with) and fails on
whatever that library refuses. ``scripts/build-cdicheck.sh`` builds and caches it (``make cdicheck``, run by
``make test``); when it is missing, the first test that needs it builds it.
"""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
BUILD_SCRIPT = REPO / "scripts" / "build-cdicheck.sh"
BUILD_TIMEOUT_S = 1800

_BINARY: list[Path] = []


def cdicheck() -> Path:
    """The cached binary for the current sources, built (under the script's lock) when missing."""
    if _BINARY:
        return _BINARY[0]
    path = Path(subprocess.run(["bash", str(BUILD_SCRIPT), "--print-path"], check=True, capture_output=True,
                               text=True, timeout=60).stdout.strip())
    if not os.access(path, os.X_OK):
        subprocess.run(["bash", str(BUILD_SCRIPT)], check=True, timeout=BUILD_TIMEOUT_S)
    if not os.access(path, os.X_OK):
        raise RuntimeError(f"{BUILD_SCRIPT} finished but {path} is still missing")
    _BINARY.append(path)
    return path


@dataclass(frozen=True)
class OracleReport:
    """What ``cdicheck`` said about one set of directories."""

    ok: bool
    specs: list[dict[str, Any]]
    errors: dict[str, list[str]]
    unresolved: list[str]
    injected: dict[str, Any] | None
    inject_error: str

    def devices(self) -> set[str]:
        """Every fully qualified device name the cache holds."""
        return {name for s in self.specs for name in s["devices"]}

    def problems(self) -> str:
        lines = [f"{path}: {e}" for path, errs in sorted(self.errors.items()) for e in errs]
        lines += [f"unresolvable CDI device {d}" for d in self.unresolved]
        if self.inject_error:
            lines.append(f"injection failed: {self.inject_error}")
        return "\n".join(lines)


def run_oracle(dirs: Sequence[Path], devices: Sequence[str] = (), inject: bool = False) -> OracleReport:
    """Load ``dirs`` into one CDI cache, resolve ``devices`` (and inject them with ``inject``)."""
    args = [str(cdicheck())]
    if inject:
        args.append("--inject")
    for d in devices:
        args += ["--device", d]
    proc = subprocess.run([*args, *map(str, dirs)], capture_output=True, text=True, timeout=60, check=False)
    if proc.returncode not in (0, 1):
        raise RuntimeError(f"cdicheck exited {proc.returncode}: {proc.stderr.strip()}")
    out = json.loads(proc.stdout)
    return OracleReport(ok=proc.returncode == 0, specs=out["specs"], errors=out["errors"],
                        unresolved=out["unresolved"], injected=out.get("injected"),
                        inject_error=out.get("injectError", ""))


def assert_cdi_accepts(spec_dir: Path, devices: Sequence[str] = (), inject: bool = False) -> OracleReport:
    """Fail with pkg/cdi's own errors unless every spec in ``spec_dir`` loads and every device resolves."""
    report = run_oracle([spec_dir], devices, inject)
    assert report.ok, f"containerd's CDI library refuses {spec_dir}:\n{report.problems()}"
    for path in sorted(spec_dir.glob("*.json")):
        relative = relative_container_paths(json.loads(path.read_text()))
        assert not relative, f"{path}: container paths must be absolute: {relative}"
    return report


def check_spec(spec: dict[str, Any], devices: Sequence[str] | None = None, inject: bool = False) -> OracleReport:
    """Run the oracle on one spec (written to a temp dir as ``<vendor>-<class>.json``). ``devices`` defaults to
    every device of the spec, fully qualified."""
    kind = str(spec.get("kind", "x/y"))
    if devices is None:
        devices = [f"{kind}={d.get('name')}" for d in spec.get("devices") or [] if isinstance(d, dict)]
    with tempfile.TemporaryDirectory(prefix="cdi-oracle-") as tmp:
        name = kind.replace("/", "-") + ".json"
        (Path(tmp) / name).write_text(json.dumps(spec))
        return run_oracle([Path(tmp)], devices, inject)




def relative_container_paths(spec: dict[str, Any]) -> list[str]:
    """Device-node and mount paths inside the container that are not absolute. pkg/cdi loads such specs (the one
    thing the old hand-written JSON schema caught that it does not); the OCI spec they are injected into wants the
    full path inside the container."""
    edits = [spec.get("containerEdits") or {}] + [d.get("containerEdits") or {} for d in spec.get("devices") or []]
    paths = [n.get("path", "") for e in edits for n in e.get("deviceNodes") or []]
    paths += [m.get("containerPath", "") for e in edits for m in e.get("mounts") or []]
    return [p for p in paths if not str(p).startswith("/")]
