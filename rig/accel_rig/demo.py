"""``accel-demo``: every daemon on fake nodes, printing what an operator checks.

The daemons run as real subprocesses (their console scripts) against fake-sysfs trees. The first sections drive
them with the small KUBELET STAND-IN from ``accel_rig.kubelet_standin`` (not the kubelet) to show each
RPC; the last one, when the Kubernetes binaries are built, runs REAL kubelets (with the fake CRI runtime) on a real
control plane and shows what each pod's container received. Nothing here imports driver code: the demo sees the
daemons only through sockets, the API, metrics and CLI output, as a node would.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, TypeVar

from accel_core.fakehost import FakeHost, build_host, clear_host
from accel_core.kubeletapi import podresources_v1_pb2 as pr
from accel_rig.kubelet_standin import KubeletStandIn
from accel_rig.polling import until

BIN = Path(sys.executable).parent
T = TypeVar("T")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _title(text: str) -> None:
    print(f"\n=== {text} " + "=" * max(0, 100 - len(text)), flush=True)


def _run(*args: str) -> str:
    return subprocess.run([str(BIN / args[0]), *args[1:]], check=True, capture_output=True, text=True).stdout


@contextlib.asynccontextmanager
async def daemon(*args: str, log: Path) -> AsyncIterator[subprocess.Popen[bytes]]:
    """Start a console-script daemon; SIGTERM it at the end and report its exit code."""
    with open(log, "wb") as fh:
        proc = subprocess.Popen([str(BIN / args[0]), *args[1:]], stdout=fh, stderr=subprocess.STDOUT)
    try:
        yield proc
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            code = proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            code = proc.wait()
        print(f"  {args[0]} stopped on SIGTERM, exit code {code} (log: {log})")


def _host(root: Path, instance_type: str) -> FakeHost:
    """A fresh fake host at ``root`` (a tree left by an earlier run with the same --workdir is replaced)."""
    clear_host(root)
    return build_host(root, instance_type)


async def _fault(*args: str) -> None:
    """Run a ``fake-sysfs`` fault verb as a user would, and echo it with its answer."""
    out = await asyncio.to_thread(_run, "fake-sysfs", *args)
    print(f"  $ fake-sysfs {' '.join(args[:1] + ('HOST',) + args[2:])}   -> {out.strip()}")


def _fetch_metrics(port: int) -> str | None:
    for _ in range(50):
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
                return str(resp.read().decode())
        except OSError:
            time.sleep(0.1)
    return None


async def _metrics_sample(port: int, picks: list[tuple[str, str]]) -> None:
    """Print, for each (metric name, label text), the first sample of that name whose labels contain the text.
    The scrape runs in a thread: a scrape asks the stand-in's PodResources service, which runs on this loop."""
    text = await asyncio.to_thread(_fetch_metrics, port)
    if text is None:
        print("    (metrics endpoint did not answer)")
        return
    for name, labels in picks:
        line = next((ln for ln in text.splitlines() if ln.startswith((name + "{", name + " ")) and labels in ln), None)
        print(f"    {line or f'{name}: (no sample with {labels})'}")


async def efa_section(work: Path) -> None:
    _title("EFA device plugin on a fake p5.48xlarge (32 EFA, 4 per GPU PCIe root)")
    host = _host(work / "p5-host", "p5.48xlarge")
    root = str(host.root)
    table = _run("efa-device-plugin", "ls", "--host-root", root).rstrip().splitlines()
    print("\n".join(table[:10] + [f"... ({len(table) - 10} more lines)"]))
    kubelet = KubeletStandIn(work / "p5-kubelet")
    await kubelet.start(pod_resources=True)
    port = _free_port()
    resource = "vpc.amazonaws.com/efa"
    async with daemon("efa-device-plugin", "serve", "--host-root", str(host.root), *kubelet.daemon_flags(),
                      "--metrics-port", str(port), "--metrics-address", "127.0.0.1", log=work / "efa.log"):
        start = time.perf_counter()
        await kubelet.wait_registered(resource, timeout=20)
        devs = await kubelet.wait_devices(resource, lambda d: len(d) == 32)
        print(f"\n  registered {resource} in {time.perf_counter() - start:.2f}s; ListAndWatch: {len(devs)} devices, "
              f"{sum(d.health == 'Healthy' for d in devs)} Healthy; first: {devs[0].ID} NUMA "
              f"{[n.ID for n in devs[0].topology.nodes]}")
        ids = [d.ID for d in devs]
        pick = await kubelet.preferred(resource, ids, [], 8)
        print(f"  GetPreferredAllocation(size=8): {pick}")
        resp = await kubelet.allocate(resource, pick[:4])
        specs = [(s.host_path, s.permissions) for s in resp.container_responses[0].devices]
        print(f"  Allocate(4) -> DeviceSpecs {specs}")
        # what the kubelet's PodResources API then lists: a pod holding those four
        kubelet.pod_resources = [_pod_resources("trainer", resource, pick[:4])]
        held, ibdev = host.efa_ibdevs[0], host.efa_ibdevs[-1]
        await _fault("port", root, ibdev, "down")
        t0 = time.perf_counter()
        await kubelet.wait_devices(resource, lambda d: sum(x.health != "Healthy" for x in d) == 1)
        print(f"    -> {ibdev} Unhealthy in ListAndWatch after {1000 * (time.perf_counter() - t0):.0f} ms")
        print(f"  metrics sample (health and allocation; {held} is held by a pod, {ibdev}'s port is down):")
        await _metrics_sample(port, [
            ("efa_device_healthy", f'device="{held}"'), ("efa_device_healthy", f'device="{ibdev}"'),
            ("efa_port_active", f'device="{ibdev}"'), ("efa_device_allocated", f'device="{held}"'),
            ("efa_device_allocated", f'device="{ibdev}"'), ("efa_device_allocations_total", f'device="{held}"'),
            ("accel_device_plugin_devices", 'health="healthy"'), ("accel_device_plugin_devices", 'health="unhealthy"'),
            ("accel_device_plugin_allocate_requests_total", 'result="ok"')])
        await _fault("port", root, ibdev, "up")
        t0 = time.perf_counter()
        await kubelet.wait_devices(resource, lambda d: all(x.health == "Healthy" for x in d))
        print(f"    -> Healthy again after {1000 * (time.perf_counter() - t0):.0f} ms")
        await kubelet.restart()
        t0 = time.perf_counter()
        await kubelet.wait_registered(resource, count=2, timeout=10)
        ms = 1000 * (time.perf_counter() - t0)
        print(f"  kubelet restart (all sockets deleted) -> re-registered after {ms:.0f} ms")
    await kubelet.stop()


def _pod_resources(name: str, resource: str, ids: list[str]) -> pr.PodResources:
    return pr.PodResources(name=name, namespace="default", containers=[pr.ContainerResources(
        name="main", devices=[pr.ContainerDevices(resource_name=resource, device_ids=ids)])])


async def neuron_section(work: Path) -> None:
    _title("Neuron device plugin on a fake trn2.48xlarge (16 devices x 8 cores, 4x4 torus, LNC 2)")
    host = _host(work / "trn2-host", "trn2.48xlarge")
    root = str(host.root)
    print(_run("neuron-device-plugin", "ls", "--host-root", root).rstrip()[:2500])
    kubelet = KubeletStandIn(work / "trn2-kubelet")
    await kubelet.start(pod_resources=True)
    port = _free_port()
    async with daemon("neuron-device-plugin", "serve", "--host-root", str(host.root), *kubelet.daemon_flags(),
                      "--metrics-port", str(port), "--metrics-address", "127.0.0.1",
                      log=work / "neuron.log"):
        chips = await kubelet.wait_devices("aws.amazon.com/neuron", lambda d: len(d) == 16, timeout=20)
        cores = await kubelet.wait_devices("aws.amazon.com/neuroncore", lambda d: len(d) == 64, timeout=20)
        print(f"\n  allocatable: aws.amazon.com/neuron={len(chips)}  aws.amazon.com/neuroncore={len(cores)}")
        pick = await kubelet.preferred("aws.amazon.com/neuron", [d.ID for d in chips], [], 4)
        print(f"  GetPreferredAllocation(neuron, size=4): {pick}  (one torus row)")
        resp = await kubelet.allocate("aws.amazon.com/neuron", pick)
        c = resp.container_responses[0]
        print(f"  Allocate -> devices {[s.host_path for s in c.devices]} env {dict(c.envs)}")
        core_pick = await kubelet.preferred("aws.amazon.com/neuroncore", [d.ID for d in cores], [], 6)
        resp = await kubelet.allocate("aws.amazon.com/neuroncore", core_pick)
        c = resp.container_responses[0]
        print(f"  neuroncore x6 -> cores {core_pick} devices {[s.host_path for s in c.devices]} env {dict(c.envs)}")
        blocked = await kubelet.wait_devices("aws.amazon.com/neuroncore",
                                             lambda d: sum(x.health != "Healthy" for x in d) >= 16, timeout=5)
        print(f"  no double counting: {sum(x.health != 'Healthy' for x in blocked)} neuroncore IDs of the 4 chips "
              "handed out are now Unhealthy")
        await _fault("neuron-error", root, "neuron9")
        t0 = time.perf_counter()
        await kubelet.wait_devices("aws.amazon.com/neuron", lambda d: any(x.ID == "9" and x.health != "Healthy"
                                                                         for x in d))
        print(f"    -> neuron 9 Unhealthy in ListAndWatch after {1000 * (time.perf_counter() - t0):.0f} ms")
        print("  metrics sample (health and allocation; neuron0-3 handed out whole, 6 cores of neuron4-5 in use, "
              "neuron9 has an uncorrected error;\n  Unhealthy on aws.amazon.com/neuron: neuron4-5, withheld for "
              "their cores, and neuron9):")
        await _metrics_sample(port, [
            ("neuron_device_plugin_device_healthy", 'neuron_device_index="0"'),
            ("neuron_device_plugin_device_healthy", 'neuron_device_index="9"'),
            ("neurondevice_hw_ecc_events_total", 'event_type="mem_ecc_uncorrected",neuron_device_index="9"'),
            ("accel_device_plugin_devices", 'health="unhealthy",resource="aws.amazon.com/neuron"'),
            ("neuron_device_plugin_ids_in_use", 'resource="aws.amazon.com/neuron"'),
            ("neuron_device_plugin_ids_in_use", 'resource="aws.amazon.com/neuroncore"'),
            ("neuron_device_plugin_ids_withheld", 'resource="aws.amazon.com/neuroncore"'),
            ("neuron_device_plugin_double_allocated_devices", ""),
            ("accel_device_plugin_allocate_requests_total", 'resource="aws.amazon.com/neuron",result="ok"')])
        await _fault("neuron-error", root, "neuron9", "--clear")
        t0 = time.perf_counter()
        await kubelet.wait_devices("aws.amazon.com/neuron", lambda d: all(x.health == "Healthy" for x in d
                                                                          if x.ID == "9"))
        print(f"    -> neuron 9 Healthy again after {1000 * (time.perf_counter() - t0):.0f} ms")
    await kubelet.stop()


def dra_section(work: Path) -> None:
    _title("Neuron DRA driver: the ResourceSlices it publishes for a fake trn2.48xlarge node")
    host = _host(work / "trn2-dra-host", "trn2.48xlarge")
    slices = json.loads(_run("neuron-dra-driver", "slices", "--host-root", str(host.root), "--node-name",
                             "trn2-node-1", "--output", "json"))
    devices = [d for s in slices for d in s["spec"].get("devices", [])]
    print(f"  {len(slices)} ResourceSlice(s), driver {slices[0]['spec']['driver']}, pool "
          f"{slices[0]['spec']['pool']['name']}, {len(devices)} devices; their topology attributes:\n")
    for line in topology_table(devices):
        print(f"  {line}")
    print("\n  Devices with one ROW id form a connected group of 4 (topology4_id), with one HALF id a group of 8"
          " (topology8_id);\n  EFA is the EFA each device is grouped with (resource.aws.com/devicegroup1_id)."
          " A claim's matchAttribute on one of them asks for a connected set.")


def topology_table(devices: list[dict[str, Any]]) -> list[str]:
    """One row per published device: name, PCI address, NUMA node, torus position and connected groups."""
    def attr(d: dict[str, Any], name: str) -> str:
        value = d.get("attributes", {}).get(name, {})
        return str(next(iter(value.values()), "-")) if value else "-"

    rows = [("DEVICE", "BDF", "NUMA", "POSITION (x,y)", "ROW", "HALF", "EFA")]
    for d in devices:
        rows.append((d["name"], attr(d, "resource.kubernetes.io/pciBusID"), attr(d, "numaNode"),
                     f"({attr(d, 'topology_x')},{attr(d, 'topology_y')})", attr(d, "topology4_id"),
                     attr(d, "topology8_id"), attr(d, "resource.aws.com/devicegroup1_id")))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows]


# The user's objects from the AWS document: the DeviceClass the chart installs and the seed's 4-connected claim.
DEVICE_CLASS = """
apiVersion: resource.k8s.io/v1
kind: DeviceClass
metadata:
  name: neuron.aws.com
spec:
  selectors:
  - cel:
      expression: device.driver == "neuron.aws.com"
"""
EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "neuron-dra" / "1x4-connected-neurons.yaml"


def _pod(name: str, node: str, limits: dict[str, str] | None = None) -> dict[str, Any]:
    container: dict[str, Any] = {"name": "app", "image": "public.ecr.aws/docker/library/busybox:latest",
                                 "command": ["sleep", "infinity"]}
    if limits:
        container["resources"] = {"limits": limits}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": "default"},
            "spec": {"nodeSelector": {"kubernetes.io/hostname": node}, "containers": [container]}}


async def cluster_section(work: Path) -> None:
    """Real kubelet nodes (the upstream kubelet with the fake CRI runtime) on a real control plane: one pod per
    daemon, and what its container received."""
    from lightkube import Client, KubeConfig, codecs
    from lightkube.resources.core_v1 import Node, Pod

    from accel_rig.controlplane import ControlPlane
    from accel_rig.kubeletnode import KubeletNode
    from accel_rig.kubeversions import kube_bin_dir, missing_binaries

    _title("Real kubelets on a real control plane: an EFA pod, a Neuron device-plugin pod, a Neuron DRA pod")
    if missing_binaries(kube_bin_dir()):
        print("  skipped: the Kubernetes binaries (kubelet, kube-apiserver, ...) are not built yet; `make kube` "
              "builds them once (~10 min)")
        return
    if os.geteuid() != 0:
        print("  skipped: a kubelet node needs root (it runs in a private mount namespace)")
        return
    if not EXAMPLE.is_file():
        print(f"  skipped: {EXAMPLE} not found (run the demo from a checkout of the repository)")
        return
    with ControlPlane(work / "cluster") as cp:
        print(f"  control plane up in {max(cp.startup_times.values()):.1f}s; kubeconfig {cp.admin_kubeconfig}")
        client = Client(KubeConfig.from_file(cp.admin_kubeconfig))
        plan = [("p5-node", "p5.48xlarge", "efa-device-plugin"), ("trn2-dp-node", "trn2.48xlarge",
                "neuron-device-plugin"), ("trn2-dra-node", "trn2.48xlarge", "neuron-dra-driver")]
        nodes: dict[str, KubeletNode] = {}
        try:
            for name, itype, _ in plan:
                kn = KubeletNode(name, work / "nodes" / name, server=cp.server, pki=cp.pki, bin_dir=cp.bin_dir,
                                 instance_type=itype)
                build_host(kn.layout.host_root, itype)
                nodes[name] = kn.start()
            for name, itype, _ in plan:
                nodes[name].wait_ready()
                print(f"  kubelet node {name} ({itype}) Ready in {nodes[name].ready_seconds:.1f}s")
            async with contextlib.AsyncExitStack() as stack:
                for name, _, script in plan:
                    env = nodes[name].daemon_env(cp.admin_kubeconfig)
                    flags = [f"--{k.lower().replace('_', '-')}={v}" for k, v in env.items()
                             if k in ("HOST_ROOT", "KUBELET_ROOT", "DEVICE_PLUGINS_DIR", "CDI_ROOT")]
                    extra = (["--node-name", name, "--kubeconfig", str(cp.admin_kubeconfig), "--healthcheck-port",
                              "-1"] if script == "neuron-dra-driver" else [])
                    await stack.enter_async_context(daemon(script, "serve", *flags, *extra, "--metrics-port", "0",
                                                           log=work / f"{name}.log"))

                def allocatable(node: str, resource: str) -> str | None:
                    status = client.get(Node, node).status
                    return (status.allocatable or {}).get(resource) if status else None

                t0 = time.perf_counter()
                await until(lambda: allocatable("p5-node", "vpc.amazonaws.com/efa") == "32", "EFA allocatable", 60, 0.3)
                await until(lambda: allocatable("trn2-dp-node", "aws.amazon.com/neuron") == "16",
                            "neuron allocatable", 60, 0.3)
                print(f"  Node allocatable after the plugins registered ({time.perf_counter() - t0:.1f}s): "
                      "p5-node vpc.amazonaws.com/efa=32; trn2-dp-node aws.amazon.com/neuron=16, neuroncore="
                      f"{allocatable('trn2-dp-node', 'aws.amazon.com/neuroncore')}")
                await until(lambda: _default_sa(client), "the default ServiceAccount", 60, 0.3)
                client.create(codecs.from_dict(_pod("efa-pod", "p5-node", {"vpc.amazonaws.com/efa": "4"})))
                client.create(codecs.from_dict(_pod("neuron-pod", "trn2-dp-node", {"aws.amazon.com/neuron": "4"})))
                docs = list(codecs.load_all_yaml(DEVICE_CLASS + "---\n" + EXAMPLE.read_text()))
                for obj in docs:
                    if obj.kind == "Pod":
                        obj.spec.nodeSelector = {"kubernetes.io/hostname": "trn2-dra-node"}
                    if obj.metadata and obj.kind != "DeviceClass":
                        obj.metadata.namespace = "default"
                    client.create(obj)
                dra_pod = "1x4-connected-neurons-workload"
                for pod, node in (("efa-pod", "p5-node"), ("neuron-pod", "trn2-dp-node"),
                                  (dra_pod, "trn2-dra-node")):
                    t0 = time.perf_counter()
                    def running(p: str = pod) -> bool:
                        return _running(client.get(Pod, p, namespace="default"))

                    await until(running, f"{pod} Running", 180, 0.3)
                    (ctr,) = nodes[node].containers(pod, "default")
                    print(f"\n  pod {pod} Running on {node} after {time.perf_counter() - t0:.1f}s; its container got:")
                    if ctr.devices:
                        print(f"    devices {ctr.device_paths}")
                    envs = {k: v for k, v in ctr.envs.items() if k.startswith("NEURON")}
                    if envs:
                        print(f"    env {envs}")
                    if ctr.cdi_devices:
                        print(f"    CDI devices {list(ctr.cdi_devices)}")
                        for spec in nodes[node].layout.cdi_root.glob("*.json"):
                            edits = [d["containerEdits"] for d in json.loads(spec.read_text())["devices"]]
                            paths = [n["path"] for e in edits for n in e.get("deviceNodes", [])]
                            spec_env = [v for e in edits for v in e.get("env", [])]
                            print(f"    which the runtime resolves from {spec.name}: devices {paths} env {spec_env}")
                print("\n  (the fake CRI runtime records what the real kubelet asked for; nothing is run)")
                for pod in ("efa-pod", "neuron-pod", dra_pod):
                    client.delete(Pod, pod, namespace="default", grace_period=0)
        finally:
            for kn in nodes.values():
                kn.stop()


async def containerd_section(work: Path) -> None:
    """The path users take, with real containers: containerd + runc under the real kubelet, the project image built
    by `make image`, the EFA chart installed by helm, and a workload container's own `ls -l /dev/infiniband`."""
    from lightkube import Client, KubeConfig, codecs
    from lightkube.resources.apps_v1 import DaemonSet
    from lightkube.resources.core_v1 import Node, Pod

    from accel_rig.containerdnode import BUSYBOX_IMAGE, RuntimeBinaries
    from accel_rig.controlplane import ControlPlane
    from accel_rig.kubeletnode import KubeletNode
    from accel_rig.kubeversions import kube_bin_dir, missing_binaries
    from accel_rig.nodelayout import CONTAINERD

    _title("Real containers: helm install of the EFA chart on a containerd node, and a workload's own /dev")
    bins = RuntimeBinaries.default()
    missing = bins.missing() + ([] if bins.app_image_built() else ["the project image"])
    if missing_binaries(kube_bin_dir()) or missing or os.geteuid() != 0:
        print("  skipped: needs root, `make kube` and `make image` (containerd, runc and the image, built once); "
              f"missing: {'; '.join(missing) or 'the Kubernetes binaries'}")
        return
    with ControlPlane(work / "cluster-containerd") as cp:
        client = Client(KubeConfig.from_file(cp.admin_kubeconfig))
        t0 = time.perf_counter()
        kn = KubeletNode("p5-containerd", work / "nodes" / "p5-containerd", server=cp.server, pki=cp.pki,
                         bin_dir=cp.bin_dir, instance_type="p5.48xlarge", runtime=CONTAINERD)
        build_host(kn.layout.host_root, "p5.48xlarge")
        try:
            kn.start()
            kn.wait_ready(timeout=180)
            print(f"  node p5-containerd (containerd + runc) Ready in {time.perf_counter() - t0:.1f}s; images: "
                  + ", ".join(i for i in kn.containerd.images() if not i.startswith("sha256")))
            chart = Path(__file__).resolve().parents[2] / "charts" / "aws-efa-k8s-device-plugin"
            argv = ["upgrade", "--install", "aws-efa-k8s-device-plugin", str(chart), "--namespace", "kube-system",
                    "--set", "image.pullPolicy=Never", "--set", f"fakeHost.path={kn.layout.fake_host_path}"]
            print("  $ helm " + " ".join(argv[:6]) + " --set image.pullPolicy=Never --set fakeHost.path=...")
            t0 = time.perf_counter()
            subprocess.run([str(cp.helm), *argv, "--kubeconfig", str(cp.admin_kubeconfig)], check=True,
                           capture_output=True, timeout=180)

            def ds_ready() -> dict[str, Any] | None:
                st = client.get(DaemonSet, "aws-efa-k8s-device-plugin-daemonset", namespace="kube-system").status
                return st.to_dict() if st and st.numberReady == 1 and st.numberAvailable == 1 else None

            st = await until(ds_ready, "the EFA DaemonSet Ready", 180, 0.3)
            print(f"  $ kubectl get ds -n kube-system   (Ready {time.perf_counter() - t0:.1f}s after helm install)")
            print("  NAME                                  DESIRED CURRENT READY UP-TO-DATE AVAILABLE")
            print(f"  aws-efa-k8s-device-plugin-daemonset   {st['desiredNumberScheduled']:<7} "
                  f"{st['currentNumberScheduled']:<7} {st['numberReady']:<5} {st.get('updatedNumberScheduled', 0):<10}"
                  f" {st['numberAvailable']}")

            def efa() -> str | None:
                status = client.get(Node, "p5-containerd").status
                value = (status.allocatable or {}).get("vpc.amazonaws.com/efa") if status else None
                return value if value and value != "0" else None

            print(f"  Node allocatable vpc.amazonaws.com/efa: {await until(efa, 'EFA allocatable', 60, 0.3)}")
            await until(lambda: _default_sa(client), "the default ServiceAccount", 60, 0.3)
            pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "efa-workload", "namespace": "default"},
                   "spec": {"nodeName": "p5-containerd", "terminationGracePeriodSeconds": 1, "containers": [
                       {"name": "app", "image": BUSYBOX_IMAGE, "imagePullPolicy": "Never",
                        "command": ["sh", "-c", "ls -l /dev/infiniband; sleep 3600"],
                        "resources": {"limits": {"vpc.amazonaws.com/efa": "4"}}}]}}
            t0 = time.perf_counter()
            client.create(codecs.from_dict(pod))
            out = await until(lambda: kn.pod_log("default", "efa-workload", "app"), "the workload's output", 180, 0.3)
            print(f"  pod efa-workload (vpc.amazonaws.com/efa: 4) ran in {time.perf_counter() - t0:.1f}s; its container"
                  " printed `ls -l /dev/infiniband`:")
            for line in out.splitlines():
                print(f"    {line}")
            client.delete(Pod, "efa-workload", namespace="default", grace_period=0)
        finally:
            kn.stop()


def _running(pod: Any) -> bool:
    return bool(pod.status and pod.status.phase == "Running")


def _default_sa(client: Any) -> bool:
    from lightkube import ApiError
    from lightkube.resources.core_v1 import ServiceAccount

    try:
        return bool(client.get(ServiceAccount, "default", namespace="default"))
    except ApiError:
        return False


async def main_async(work: Path, with_cluster: bool) -> None:
    await efa_section(work)
    await neuron_section(work)
    dra_section(work)
    if with_cluster:
        await cluster_section(work)
        await containerd_section(work)
    _title("done")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="accel-demo", description=__doc__)
    parser.add_argument("--workdir", help="keep fake hosts and logs here (default: a temp dir, removed at exit)")
    parser.add_argument("--no-cluster", action="store_true",
                        help="skip the section that runs the DRA driver against a real control plane")
    args = parser.parse_args(argv)
    if args.workdir:
        work = Path(args.workdir)
        work.mkdir(parents=True, exist_ok=True)
        asyncio.run(main_async(work, not args.no_cluster))
        return 0
    with tempfile.TemporaryDirectory(prefix="accel-demo-", dir="/tmp") as tmp:
        os.chmod(tmp, 0o755)
        asyncio.run(main_async(Path(tmp), not args.no_cluster))
    return 0


if __name__ == "__main__":
    sys.exit(main())
