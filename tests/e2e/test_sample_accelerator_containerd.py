"""The made-up third accelerator in production form: its chart (tests/sample_accelerator/chart, two blocks on the
library chart) installed by helm on a containerd node, from an image built by the project's Dockerfile with the
sample's distribution in the build context's accelerators/ (scripts/build-images.sh --accelerator; no Dockerfile
edit). Also: helm prints nothing on stderr for the seeds' install commands, dry run, against a real API server.

Facts from outside the daemons: the sample's catalog file gives sacc.8xlarge 4 devices of major 250 (``/dev/saccN``,
minor N); its declaration names the resource ``example.com/sacc`` and the env ``SACC_VISIBLE_DEVICES``."""

from __future__ import annotations

import re
import shlex
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from accel_rig.containerdnode import RuntimeBinaries
from accel_rig.controlplane import ControlPlane
from accel_rig.nodelayout import CONTAINERD
from chart_render import EFA_CHART, NEURON_CHART, NEURON_OCI, SEED_DEVICE_PLUGIN_INSTALL, SEED_DRA_INSTALL
from conftest import RealNode
from lightkube import Client
from runtime_helpers import BUSYBOX, REPO, Helm, allocatable, applied, ds_ready, rig_flags

pytestmark = pytest.mark.containerd

Wait = Callable[..., Any]
SAMPLE = REPO / "tests" / "sample_accelerator"
CHART = SAMPLE / "chart"
RESOURCE, TYPE, DEVICES, MAJOR = "example.com/sacc", "sacc.8xlarge", 4, 250
#: docs/charts.md's EFA install (the seeds install only the Neuron chart).
DOCS_EFA_INSTALL = "helm upgrade --install aws-efa-k8s-device-plugin ./charts/aws-efa-k8s-device-plugin " \
                   "--namespace kube-system"
SHOW = "ls -l /dev/ | grep sacc; echo ---env; env | sort; echo ---end; exec sleep 3600"


def sample_image() -> str:
    """The image the sample chart installs by default (its values and appVersion)."""
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    return f"{values['image']['repository']}:{yaml.safe_load((CHART / 'Chart.yaml').read_text())['appVersion']}"


@pytest.fixture(scope="module")
def image_archive() -> Path:
    """The project image plus the sample's distribution, built from the Dockerfile (cached by content)."""
    name = sample_image()
    build = subprocess.run([str(REPO / "scripts" / "build-images.sh"), "--accelerator", str(SAMPLE), "--name", name],
                           check=False, timeout=1800, capture_output=True, text=True)
    assert build.returncode == 0, f"build-images.sh failed:\n{build.stdout[-1500:]}\n{build.stderr[-3000:]}"
    archive = RuntimeBinaries.default().images / f"app+{re.sub(r'[/:]', '_', name)}-current" / "image.oci.tar"
    assert archive.is_file(), archive
    return archive


def helm_run(helm: Helm, *args: str) -> subprocess.CompletedProcess[str]:
    """helm as the tests' Helm runs it, keeping stderr."""
    proc = subprocess.run([str(helm.binary), *args, "--kubeconfig", helm.kubeconfig], env=helm.env,
                          capture_output=True, text=True, timeout=180, check=False)
    assert proc.returncode == 0, f"helm {' '.join(args)}:\n{proc.stdout}\n{proc.stderr}"
    return proc


@pytest.fixture
def helm(control_plane: ControlPlane, tmp_path: Path) -> Helm:
    return Helm(control_plane, tmp_path / "helm")


@pytest.mark.parametrize("seed", [SEED_DRA_INSTALL, SEED_DEVICE_PLUGIN_INSTALL, DOCS_EFA_INSTALL],
                         ids=["dra", "device-plugin", "docs-efa"])
def test_seed_installs_dry_run_print_nothing_on_stderr(helm: Helm, seed: str) -> None:
    """Issue 34 item 8: no "found symbolic link" (or any other) line from helm for the seeds' commands (and the
    docs' EFA one), the local chart standing in for the OCI one."""
    argv = shlex.split(seed.replace("\\\n", " "))
    local = {NEURON_OCI: str(NEURON_CHART), "./charts/aws-efa-k8s-device-plugin": str(EFA_CHART)}
    proc = helm_run(helm, *[local.get(a, a) for a in argv[1:]], "--dry-run")
    assert proc.stderr == "", proc.stderr
    assert "kind: DaemonSet" in proc.stdout


def test_the_sample_chart_installs_and_its_device_plugin_serves_a_pod(
        image_archive: Path, kubelet_node: Callable[..., RealNode], kube_client: Client, helm: Helm,
        namespace: str, wait: Wait) -> None:
    node = kubelet_node(TYPE, runtime=CONTAINERD)
    out = node.kubelet.containerd.ctr("images", "import", "--local", str(image_archive), timeout=300)
    assert out.returncode == 0, out.stderr
    subprocess.run([str(REPO / "scripts" / "chart-deps.sh"), str(CHART)], check=True, timeout=60)
    release, ns = "sacc", "sacc-system"
    proc = helm_run(helm, "upgrade", "--install", release, str(CHART), "--namespace", ns, "--create-namespace",
                    *rig_flags(node.kubelet))
    assert proc.stderr == "", proc.stderr
    try:
        wait(lambda: ds_ready(kube_client, ns, "sacc-device-plugin"), "kubectl get ds: sacc-device-plugin READY 1",
             timeout=180)
        wait(lambda: allocatable(kube_client, node.name, RESOURCE) == DEVICES, f"{RESOURCE}: {DEVICES} on the Node",
             timeout=90)
        pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "sacc-two"},
               "spec": {"nodeName": node.name, "restartPolicy": "Never", "terminationGracePeriodSeconds": 1,
                        "containers": [{"name": "app", "image": BUSYBOX, "imagePullPolicy": "Never",
                                        "command": ["sh", "-c", SHOW], "resources": {"limits": {RESOURCE: "2"}}}]}}
        with applied(kube_client, namespace, [pod]):
            text = wait(lambda: (t := node.kubelet.pod_log(namespace, "sacc-two", "app")) and "---end" in t and t,
                        "the sacc pod's own output", timeout=120)
            devices = {m.group(3): (int(m.group(1)), int(m.group(2)))
                       for m in re.finditer(r"^c\S+\s+\d+\s+\S+\s+\S+\s+(\d+),\s*(\d+)\s.*?(sacc\d+)$", text, re.M)}
            env = dict(line.split("=", 1) for line in text.partition("---env\n")[2].splitlines() if "=" in line)
            assert len(devices) == 2, text
            indices = sorted(int(n.removeprefix("sacc")) for n in devices)
            assert all(devices[f"sacc{i}"] == (MAJOR, i) for i in indices), devices
            assert env.get("SACC_VISIBLE_DEVICES") == ",".join(map(str, indices)), env
            assert allocatable(kube_client, node.name, RESOURCE) == DEVICES  # allocatable counts held devices too
    finally:
        helm("uninstall", release, "--namespace", ns, "--wait", "--timeout", "120s")
