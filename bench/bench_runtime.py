"""The deployment path with real containers (containerd + runc, `make image`), timed: node Ready with fakecri vs
containerd, helm install to DaemonSet Ready for each chart, pod create to Running for each workload kind, and each
daemon's RSS inside its container (VmRSS of the container's process).

    PYTHONPATH=. .venv/bin/python bench/bench_runtime.py [--keep]

Needs root, `make kube` and `make image`. One control plane; nodes p5 (EFA chart) and trn2 (Neuron device plugin,
then the Neuron DRA driver with the EFA DRA driver), each created twice: fakecri then containerd.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml
from accel_rig.containerdnode import BUSYBOX_IMAGE
from accel_rig.controlplane import ControlPlane
from accel_rig.kubeletnode import KubeletNode
from accel_rig.nodelayout import CONTAINERD, FAKECRI
from lightkube import ApiError, Client, KubeConfig, codecs
from lightkube.resources.apps_v1 import DaemonSet
from lightkube.resources.core_v1 import Node, Pod, ServiceAccount
from lightkube.resources.resource_v1 import ResourceClaim, ResourceSlice

from accel_core.fakehost import build_host

REPO = Path(__file__).resolve().parents[1]
EFA_CHART = REPO / "charts" / "aws-efa-k8s-device-plugin"
NEURON_CHART = REPO / "charts" / "neuron-helm-chart"


def poll(check: Callable[[], Any], what: str, timeout: float = 180) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            value = check()
        except ApiError:
            value = None
        if value:
            return value
        time.sleep(0.1)
    raise TimeoutError(what)


def main() -> int:
    work = Path(tempfile.mkdtemp(prefix="bench-runtime-"))
    with ControlPlane(work / "cp") as cp:
        client = Client(KubeConfig.from_file(cp.admin_kubeconfig))
        poll(lambda: client.get(ServiceAccount, "default", namespace="default"), "default ServiceAccount")

        def helm(*args: str) -> None:
            subprocess.run([str(cp.helm), *args, "--kubeconfig", str(cp.admin_kubeconfig)], check=True,
                           capture_output=True, timeout=300)

        def node(name: str, itype: str, runtime: str) -> KubeletNode:
            kn = KubeletNode(name, work / name, server=cp.server, pki=cp.pki, bin_dir=cp.bin_dir,
                             instance_type=itype, runtime=runtime)
            build_host(kn.layout.host_root, itype)
            t0 = time.perf_counter()
            kn.start()
            kn.wait_ready(timeout=180)
            print(f"node Ready ({runtime:<10} {itype:<14}) {time.perf_counter() - t0:6.1f} s")
            return kn

        def ds_ready(ns: str, name: str) -> bool:
            st = client.get(DaemonSet, name, namespace=ns).status
            return bool(st and st.numberReady == 1 and st.numberAvailable == 1)

        def rss(kn: KubeletNode, ns: str, labels: dict[str, str]) -> float:
            (pod,) = client.list(Pod, namespace=ns, labels=labels)
            cid = pod.status.containerStatuses[0].containerID.removeprefix("containerd://")  # type: ignore[union-attr]
            (pid,) = [ln.split()[1] for ln in kn.containerd.ctr("tasks", "list").stdout.splitlines()
                      if ln.startswith(cid)]
            kb = next(int(ln.split()[1]) for ln in Path(f"/proc/{pid}/status").read_text().splitlines()
                      if ln.startswith("VmRSS:"))
            return kb / 1024

        def run_pod(kn: KubeletNode, doc: dict[str, Any], label: str) -> None:
            t0 = time.perf_counter()
            client.create(codecs.from_dict(doc), namespace="default")
            name = doc["metadata"]["name"]
            poll(lambda: (p := client.get(Pod, name, namespace="default")).status and p.status.phase == "Running",
                 f"{name} Running")
            pod = client.get(Pod, name, namespace="default")
            created = pod.metadata.creationTimestamp  # type: ignore[union-attr]
            sched = next(c.lastTransitionTime for c in pod.status.conditions  # type: ignore[union-attr]
                         if c.type == "PodScheduled")
            print(f"pod create to Running ({label:<34}) {time.perf_counter() - t0:6.1f} s "
                  f"(bound after {(sched - created).total_seconds():.0f} s, API timestamps in whole seconds)")
            # Not grace 0: a force delete frees the claim's devices in the API while the kubelet still holds them
            # prepared, and the next claim's prepare is then refused until the kubelet has unprepared the old one.
            client.delete(Pod, name, namespace="default", grace_period=1)
            poll(lambda: not list(client.list(Pod, namespace="default", fields={"metadata.name": name})),
                 f"{name} gone", 60)
            poll(lambda: not list(client.list(ResourceClaim, namespace="default")), "its claims gone", 60)

        def dp_pod(name: str, node_name: str, resource: str, count: int) -> dict[str, Any]:
            return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
                    "spec": {"nodeName": node_name, "terminationGracePeriodSeconds": 1,
                             "containers": [{"name": "app", "image": BUSYBOX_IMAGE, "imagePullPolicy": "Never",
                                             "command": ["sleep", "3600"],
                                             "resources": {"limits": {resource: str(count)}}}]}}

        for name, itype in (("rf-p5", "p5.48xlarge"), ("rf-trn2", "trn2.48xlarge")):
            node(name, itype, FAKECRI).stop()
            client.delete(Node, name)
        p5 = node("rc-p5", "p5.48xlarge", CONTAINERD)
        trn2 = node("rc-trn2", "trn2.48xlarge", CONTAINERD)
        rig = ["--set", "image.pullPolicy=Never"]
        try:
            t0 = time.perf_counter()
            helm("upgrade", "--install", "efa", str(EFA_CHART), "--namespace", "kube-system", *rig,
                 "--set", f"fakeHost.path={p5.layout.host_root}",
                 "--set", "nodeSelector.kubernetes\\.io/hostname=rc-p5")
            poll(lambda: ds_ready("kube-system", "aws-efa-k8s-device-plugin-daemonset"), "EFA DS")
            print(f"helm install to DaemonSet Ready (EFA device plugin)    {time.perf_counter() - t0:6.1f} s")
            poll(lambda: (client.get(Node, "rc-p5").status.allocatable or {}).get("vpc.amazonaws.com/efa") == "32",
                 "EFA allocatable")
            run_pod(p5, dp_pod("efa-4", "rc-p5", "vpc.amazonaws.com/efa", 4), "device plugin, efa: 4")
            efa_rss = rss(p5, "kube-system", {"name": "aws-efa-k8s-device-plugin"})
            print(f"RSS in its container: efa-device-plugin              {efa_rss:6.1f} MiB")

            t0 = time.perf_counter()
            helm("upgrade", "--install", "neuron-dp", str(NEURON_CHART), *rig, "--set", "npd.enabled=false",
                 "--set", f"fakeHost.path={trn2.layout.host_root}")
            poll(lambda: ds_ready("kube-system", "neuron-device-plugin"), "Neuron DP DS")
            print(f"helm install to DaemonSet Ready (Neuron device plugin) {time.perf_counter() - t0:6.1f} s")
            poll(lambda: (client.get(Node, "rc-trn2").status.allocatable or {}).get("aws.amazon.com/neuron") == "16",
                 "neuron allocatable")
            run_pod(trn2, dp_pod("neuron-4", "rc-trn2", "aws.amazon.com/neuron", 4), "device plugin, neuron: 4")
            print(f"RSS in its container: neuron-device-plugin           "
                  f"{rss(trn2, 'kube-system', {'name': 'neuron-device-plugin-ds'}):6.1f} MiB")
            helm("uninstall", "neuron-dp", "--wait")

            t0 = time.perf_counter()
            helm("upgrade", "--install", "neuron-helm-chart", str(NEURON_CHART), "--namespace", "neuron-dra-driver",
                 "--create-namespace", *rig, "--set", "devicePlugin.enabled=false", "--set", "npd.enabled=false",
                 "--set", "draDriver.enabled=true", "--set", f"fakeHost.path={trn2.layout.host_root}")
            poll(lambda: ds_ready("neuron-dra-driver", "neuron-dra-driver-kubelet-plugin"), "Neuron DRA DS")
            print(f"helm install to DaemonSet Ready (Neuron DRA driver)    {time.perf_counter() - t0:6.1f} s")
            helm("upgrade", "--install", "efa-dra", str(EFA_CHART), "--namespace", "kube-system", *rig,
                 "--set", "devicePlugin.enabled=false", "--set", "draDriver.enabled=true",
                 "--set", f"fakeHost.path={trn2.layout.host_root}",
                 "--set", "nodeSelector.kubernetes\\.io/hostname=rc-trn2")
            poll(lambda: ds_ready("kube-system", "aws-efa-k8s-device-plugin-dra-driver"), "EFA DRA DS")
            poll(lambda: {s.spec.driver for s in client.list(ResourceSlice) if s.spec.nodeName == "rc-trn2"}
                 >= {"neuron.aws.com", "efa.aws.com"}, "both drivers' slices")
            for example in ("neuron-dra/1x4-connected-neurons.yaml", "efa-dra/trn2-4-neurons-with-their-efa.yaml"):
                docs = [d for d in yaml.safe_load_all((REPO / "examples" / example).read_text()) if d]
                for d in docs:
                    if d["kind"] == "Pod":
                        for c in d["spec"]["containers"]:
                            c.update(image=BUSYBOX_IMAGE, imagePullPolicy="Never", command=["sleep", "3600"])
                        d["spec"]["terminationGracePeriodSeconds"] = 1
                        run_pod(trn2, d, "DRA claim, " + Path(example).stem)
                    else:
                        client.create(codecs.from_dict(d), namespace="default")
            print(f"RSS in its container: neuron-dra-driver              "
                  f"{rss(trn2, 'neuron-dra-driver', {'app.kubernetes.io/component': 'kubelet-plugin'}):6.1f} MiB")
        finally:
            for kn in (p5, trn2):
                kn.stop()
    if "--keep" in sys.argv:
        print(f"node directories and logs kept in {work}")
    else:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
