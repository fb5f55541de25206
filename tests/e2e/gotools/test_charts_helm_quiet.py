"""helm says nothing on stderr for the seeds' commands on this project's charts (issue 34 item 8: it printed "found
symbolic link in path: charts/neuron-helm-chart/charts/accel-dra-lib ..." on every command while the library was a
committed link). The real helm, its template and lint of each documented install line; the install itself, dry run
and real, against a real API server: tests/e2e/test_sample_accelerator_containerd.py."""

from __future__ import annotations

import os
import shlex
import subprocess
from pathlib import Path

import pytest
from chart_render import (
    EFA_CHART,
    NEURON_CHART,
    REPO,
    SEED_DEVICE_PLUGIN_INSTALL,
    SEED_DRA_INSTALL,
    seed_as_template,
)

pytestmark = pytest.mark.gotools  # helm, built from Go (the shared fixture in tests/e2e/conftest.py)

#: docs/charts.md's EFA install, verbatim (the seeds install only the Neuron chart).
DOCS_EFA_INSTALL = "helm upgrade --install aws-efa-k8s-device-plugin ./charts/aws-efa-k8s-device-plugin " \
                   "--namespace kube-system"
#: (release, chart, flags) of each documented install line, the local chart standing in for the OCI one.
COMMANDS = {
    "seed DRA": seed_as_template(SEED_DRA_INSTALL, NEURON_CHART)[1:],
    "seed device plugin": seed_as_template(SEED_DEVICE_PLUGIN_INSTALL, NEURON_CHART)[1:],
    "docs EFA": shlex.split(DOCS_EFA_INSTALL)[3:],
}


def run(helm: Path, tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("HELM_") and k != "KUBECONFIG"}
    env |= {v: str(tmp_path / v.lower()) for v in ("HELM_CACHE_HOME", "HELM_CONFIG_HOME", "HELM_DATA_HOME")}
    env["KUBECONFIG"] = str(tmp_path / "no-kubeconfig")
    return subprocess.run([str(helm), *args], cwd=REPO, env=env, capture_output=True, text=True, timeout=120,
                          check=False)


def test_the_docs_efa_line_is_the_docs() -> None:
    assert DOCS_EFA_INSTALL in " ".join((REPO / "docs" / "charts.md").read_text().split())
    assert COMMANDS["docs EFA"][1] == "./charts/aws-efa-k8s-device-plugin" and EFA_CHART.is_dir()


@pytest.mark.parametrize("verb", ["template", "lint"])
@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_helm_prints_no_warning(helm: Path, tmp_path: Path, name: str, verb: str) -> None:
    release, chart, *flags = COMMANDS[name]
    if verb == "lint":  # lint takes the chart and the values, not a release or namespace
        flags = [f for f, prev in zip(flags, ["", *flags[:-1]], strict=True)
                 if f.startswith("--set") or prev.startswith("--set")]
        args = ["lint", chart, *flags]
    else:
        args = ["template", release, chart, *flags]
    proc = run(helm, tmp_path, *args)
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == "", f"helm {' '.join(args)} printed on stderr:\n{proc.stderr}"
    assert "kind: DaemonSet" in proc.stdout or verb == "lint"
