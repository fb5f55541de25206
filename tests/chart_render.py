"""Helpers for the Helm chart tests: find (or build) helm, render a chart, look objects up in the output."""

from __future__ import annotations

import fcntl
import os
import shlex
import subprocess
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from accel_rig.kubeversions import build_script, kube_bin_dir, kube_cache_root

REPO = Path(__file__).resolve().parents[1]
NEURON_CHART = REPO / "charts" / "neuron-helm-chart"
EFA_CHART = REPO / "charts" / "aws-efa-k8s-device-plugin"
#: Where the AWS documents install the Neuron chart from; the tests put the local chart in its place.
NEURON_OCI = "oci://public.ecr.aws/neuron/neuron-helm-chart"

#: The two Neuron install commands of the EKS guide (seed "Amazon EKS에서 Neuron 장치 관리하기"), verbatim.
SEED_DRA_INSTALL = """helm upgrade --install neuron-helm-chart oci://public.ecr.aws/neuron/neuron-helm-chart \\
--namespace neuron-dra-driver \\
--create-namespace \\
--set "devicePlugin.enabled=false" \\
--set "npd.enabled=false" \\
--set "draDriver.enabled=true"
"""
SEED_DEVICE_PLUGIN_INSTALL = (
    "helm upgrade --install neuron-helm-chart oci://public.ecr.aws/neuron/neuron-helm-chart \\\n"
    '--set "npd.enabled=false"\n'
)

BUILD_TIMEOUT_S = 3 * 3600


def find_or_build_helm() -> Path:
    """The helm binary that scripts/build-kube.sh caches; when missing, only helm is built (under the shared build
    lock), not the whole control plane."""
    helm = kube_bin_dir() / "helm"
    if os.access(helm, os.X_OK):
        return helm
    root = kube_cache_root()
    root.mkdir(parents=True, exist_ok=True)
    with (root / ".build.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another session may be building the same thing
        if not os.access(helm, os.X_OK):
            subprocess.run(["bash", str(build_script()), "--helm-only"], check=True, timeout=BUILD_TIMEOUT_S)
    if not os.access(helm, os.X_OK):
        raise RuntimeError(f"{build_script()} finished but {helm} is still missing")
    return helm


class RenderError(Exception):
    """helm exited non-zero; the message is its stderr."""


@dataclass(frozen=True)
class Rendered:
    """The objects of one ``helm template`` run."""

    docs: tuple[dict[str, Any], ...]

    def all(self, kind: str) -> list[dict[str, Any]]:
        return [d for d in self.docs if d["kind"] == kind]

    def names(self, kind: str) -> set[str]:
        return {d["metadata"]["name"] for d in self.all(kind)}

    def get(self, kind: str, name: str) -> dict[str, Any]:
        found = [d for d in self.all(kind) if d["metadata"]["name"] == name]
        assert len(found) == 1, f"expected one {kind} {name}, found {len(found)}; have {self.kinds()}"
        return found[0]

    def kinds(self) -> dict[str, set[str]]:
        out: dict[str, set[str]] = {}
        for d in self.docs:
            out.setdefault(d["kind"], set()).add(d["metadata"]["name"])
        return out

    def __iter__(self) -> Iterator[dict[str, Any]]:
        return iter(self.docs)


_RUNS: dict[tuple[str, ...], tuple[int, str, str]] = {}


def run_helm(helm: Path, args: Sequence[str]) -> str:
    """helm's stdout; the same command line is run once per test process (the charts do not change during a run,
    and every file argument a test writes lives under its own temp dir)."""
    key = (str(helm), *args)
    if key not in _RUNS:
        proc = subprocess.run(list(key), capture_output=True, text=True, timeout=120, check=False)
        _RUNS[key] = (proc.returncode, proc.stdout, proc.stderr)
    code, out, err = _RUNS[key]
    if code != 0:
        raise RenderError(err.strip())
    return out


def parse(text: str) -> Rendered:
    return Rendered(tuple(d for d in yaml.safe_load_all(text) if d))


def template(helm: Path, chart: Path, *args: str, release: str = "test") -> Rendered:
    """``helm template RELEASE CHART ARGS...`` parsed."""
    return parse(run_helm(helm, ["template", release, str(chart), *args]))


def seed_as_template(command: str, chart: Path) -> list[str]:
    """A documented ``helm upgrade --install NAME oci://... FLAGS`` line as ``template NAME <chart> FLAGS``: the same
    release name, namespace and --set flags, rendered from the local chart."""
    argv = shlex.split(command.replace("\\\n", " "))
    assert argv[:3] == ["helm", "upgrade", "--install"], argv
    rest = [str(chart) if a == NEURON_OCI else a for a in argv[3:]]
    assert str(chart) in rest, f"the command does not install {NEURON_OCI}: {command}"
    return ["template", *rest]


def container(ds: dict[str, Any], name: str | None = None) -> dict[str, Any]:
    containers = ds["spec"]["template"]["spec"]["containers"]
    if name is None:
        assert len(containers) == 1
        return dict(containers[0])
    return dict(next(c for c in containers if c["name"] == name))


def env_of(c: dict[str, Any]) -> dict[str, Any]:
    """name -> value, or name -> the valueFrom mapping."""
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in c.get("env", [])}


def mounts_of(ds: dict[str, Any], name: str | None = None) -> dict[str, dict[str, Any]]:
    """container mountPath -> {"host": hostPath path (or None), "type": hostPath type, "readOnly": bool}."""
    volumes = {v["name"]: v for v in ds["spec"]["template"]["spec"]["volumes"]}
    out: dict[str, dict[str, Any]] = {}
    for m in container(ds, name)["volumeMounts"]:
        host = volumes[m["name"]].get("hostPath")
        out[m["mountPath"]] = {
            "host": host["path"] if host else None,
            "type": host.get("type") if host else None,
            "readOnly": bool(m.get("readOnly", False)),
        }
    return out


def node_terms(ds: dict[str, Any]) -> list[list[dict[str, Any]]]:
    """The required node-affinity terms of a DaemonSet's pods, as lists of match expressions."""
    affinity = ds["spec"]["template"]["spec"]["affinity"]["nodeAffinity"]
    terms = affinity["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    return [list(t["matchExpressions"]) for t in terms]


def node_matches(ds: dict[str, Any], labels: dict[str, str]) -> bool:
    """Whether a node with these labels satisfies the DaemonSet's required node affinity (In/NotIn/Exists)."""

    def expr_ok(e: dict[str, Any]) -> bool:
        value = labels.get(e["key"])
        op = e["operator"]
        if op == "In":
            return value in e["values"]
        if op == "NotIn":
            return value not in e["values"]
        if op == "Exists":
            return value is not None
        if op == "DoesNotExist":
            return value is None
        raise AssertionError(f"operator {op} not modelled")

    return any(all(expr_ok(e) for e in term) for term in node_terms(ds))
