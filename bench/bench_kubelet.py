"""Figures of the real-kubelet rig: kubelet start to Node Ready, device plugin start to allocatable updated, DRA
driver start to slices published, pod create to Running for each daemon (the DRA prepare time apart, from the
driver's log), and a warm `scripts/build-kube.sh`.

    PYTHONPATH=. .venv/bin/python bench/bench_kubelet.py [--rounds 3]

Needs root and the built binaries (make kube). Each figure is printed; nothing is asserted.
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml
from accel_rig.controlplane import ControlPlane
from accel_rig.kubeletnode import KubeletNode
from accel_rig.kubeversions import build_script
from lightkube import ApiError, Client, KubeConfig, codecs
from lightkube.resources.core_v1 import Node, Pod, ServiceAccount
from lightkube.resources.resource_v1 import ResourceSlice

from accel_core.fakehost import build_host

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent


def wait(check: Callable[[], Any], what: str, timeout: float = 120.0) -> float:
    """Seconds until ``check`` is truthy."""
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < timeout:
        try:
            if check():
                return time.perf_counter() - t0
        except ApiError:
            pass
        time.sleep(0.05)
    raise TimeoutError(what)


def allocatable(client: Client, node: str, resource: str) -> str | None:
    status = client.get(Node, node).status
    return (status.allocatable or {}).get(resource) if status else None


def pod(name: str, node: str, limits: dict[str, str] | None = None, claim: str | None = None) -> Any:
    ctr: dict[str, Any] = {"name": "app", "image": "busybox"}
    spec: dict[str, Any] = {"nodeSelector": {"kubernetes.io/hostname": node}, "containers": [ctr],
                            "terminationGracePeriodSeconds": 0}
    if limits:
        ctr["resources"] = {"limits": limits}
    if claim:
        ctr["resources"] = {"claims": [{"name": "c"}]}
        spec["resourceClaims"] = [{"name": "c", "resourceClaimTemplateName": claim}]
    return codecs.from_dict({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": "default"},
                             "spec": spec})


def running(client: Client, name: str) -> bool:
    status = client.get(Pod, name, namespace="default").status
    return bool(status and status.phase == "Running")


def start_daemon(script: str, env: dict[str, str], log: Path, *args: str) -> subprocess.Popen[bytes]:
    with log.open("wb") as fh:
        return subprocess.Popen([str(BIN / script), "serve", "--metrics-port", "0", *args],
                                env={**os.environ, **env}, stdout=fh, stderr=subprocess.STDOUT)


def stop(proc: subprocess.Popen[bytes]) -> None:
    proc.send_signal(signal.SIGTERM)
    proc.wait(30)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=3, help="kubelet starts to time")
    args = parser.parse_args()
    if os.geteuid() != 0:
        print("needs root (the kubelet runs in a private mount namespace)")
        return 1
    t0 = time.perf_counter()
    subprocess.run(["bash", str(build_script())], check=True, capture_output=True)
    print(f"warm scripts/build-kube.sh (everything cached): {1000 * (time.perf_counter() - t0):.0f} ms")

    with tempfile.TemporaryDirectory(prefix="bk-", dir="/dev/shm" if os.access("/dev/shm", os.W_OK) else None) as tmp:
        work = Path(tmp)
        with ControlPlane(work / "cp") as cp:
            client = Client(KubeConfig.from_file(cp.admin_kubeconfig))

            def node(name: str, itype: str) -> KubeletNode:
                kn = KubeletNode(name, work / name, server=cp.server, pki=cp.pki, bin_dir=cp.bin_dir,
                                 instance_type=itype)
                build_host(kn.layout.host_root, itype)
                return kn

            ready = []
            for i in range(args.rounds):
                kn = node(f"r{i}", "c5.large").start()
                kn.wait_ready()
                assert kn.ready_seconds is not None
                ready.append(kn.ready_seconds)
                t0 = time.perf_counter()
                kn.stop()
                print(f"kubelet start -> Node Ready: {kn.ready_seconds:.2f} s; stop {time.perf_counter() - t0:.2f} s")
            print(f"kubelet start -> Node Ready, median of {len(ready)}: {statistics.median(ready):.2f} s")

            p5, trn_dp, trn_dra = node("p5", "p5.48xlarge"), node("trn-dp", "trn2.48xlarge"), node("trn-dra",
                                                                                                  "trn2.48xlarge")
            for kn in (p5, trn_dp, trn_dra):
                kn.start()
            for kn in (p5, trn_dp, trn_dra):
                kn.wait_ready()
            wait(lambda: client.get(ServiceAccount, "default", namespace="default"), "default ServiceAccount")
            procs = []
            try:
                procs.append(start_daemon("efa-device-plugin", p5.daemon_env(cp.admin_kubeconfig), work / "efa.log"))
                s = wait(lambda: allocatable(client, "p5", "vpc.amazonaws.com/efa") == "32", "EFA allocatable")
                print(f"EFA device plugin start -> Node allocatable efa=32: {s:.2f} s "
                      "(the kubelet posts node status every 2 s here)")
                procs.append(start_daemon("neuron-device-plugin", trn_dp.daemon_env(cp.admin_kubeconfig),
                                          work / "ndp.log"))
                s = wait(lambda: allocatable(client, "trn-dp", "aws.amazon.com/neuron") == "16", "neuron allocatable")
                print(f"Neuron device plugin start -> Node allocatable neuron=16: {s:.2f} s")
                dra_log = work / "dra.log"
                procs.append(start_daemon("neuron-dra-driver", trn_dra.daemon_env(cp.admin_kubeconfig), dra_log,
                                          "--healthcheck-port", "-1"))
                s = wait(lambda: list(client.list(ResourceSlice, fields={"spec.nodeName": "trn-dra"})),
                         "slices")
                print(f"Neuron DRA driver start -> ResourceSlices published: {s:.2f} s")
                wait(lambda: "kubelet registered the DRA plugin" in dra_log.read_text(), "DRA registration")
                out = subprocess.run([str(cp.helm), "template", "n", str(REPO / "charts/neuron-helm-chart"),
                                      "--set", "draDriver.enabled=true", "--set", "devicePlugin.enabled=false",
                                      "--set", "npd.enabled=false"], capture_output=True, text=True, check=True)
                for doc in yaml.safe_load_all(out.stdout):
                    if doc and doc["kind"] == "DeviceClass":
                        client.create(codecs.from_dict(doc))
                for doc in yaml.safe_load_all((REPO / "examples/neuron-dra/1x4-connected-neurons.yaml").read_text()):
                    if doc["kind"] == "ResourceClaimTemplate":
                        doc["metadata"]["namespace"] = "default"
                        client.create(codecs.from_dict(doc))
                for name, obj in (("efa-pod", pod("efa-pod", "p5", {"vpc.amazonaws.com/efa": "4"})),
                                  ("neuron-pod", pod("neuron-pod", "trn-dp", {"aws.amazon.com/neuron": "4"})),
                                  ("dra-pod", pod("dra-pod", "trn-dra", claim="1x4-connected-neurons"))):
                    t0 = time.perf_counter()
                    client.create(obj)
                    s = wait(lambda n=name: running(client, n), f"{name} Running")
                    print(f"pod create -> Running, {name}: {s:.2f} s")
                prepares = [float(m) for m in re.findall(r'msg="prepare ok".*?seconds=([0-9.]+)', dra_log.read_text())]
                print(f"  of which the DRA driver's NodePrepareResources: {1000 * sum(prepares):.1f} ms")
            finally:
                for proc in procs:
                    stop(proc)
                for kn in (p5, trn_dp, trn_dra):
                    kn.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
