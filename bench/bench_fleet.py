"""Fleet scale: many real ``neuron-dra-driver serve`` processes (one per fake trn2.48xlarge node) against one real
kube-apiserver and kube-scheduler.

For each fleet size (default 10, 25, 50; the fleet grows in place) it prints: seconds from starting the new drivers
until every node's slice is published; API requests per node over an idle window and per device health change
(from the API server's own ``apiserver_request_total``, resources the drivers touch: resourceslices,
resourceclaims, nodes); the scheduler's time to allocate a 4-connected claim (the ``1x4-connected-neurons`` request
of the AWS document) as the slices grow; each driver's mean RSS; and the growth from the smallest to the largest
fleet per node (linear or better means the per-node figures stay flat).

All drivers read one shared fake host tree (read-only for them), so one counter write is a health change on every
node at once. Needs the Kubernetes binaries (scripts/build-kube.sh).

    .venv/bin/python bench/bench_fleet.py [--sizes 10,25,50] [--idle 30]
"""

from __future__ import annotations

import argparse
import os
import signal
import ssl
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

from accel_rig.controlplane import ControlPlane
from accel_rig.kubeversions import kube_bin_dir, missing_binaries
from compare_common import console_script, rss_mib
from lightkube import Client, KubeConfig
from lightkube.resources.core_v1 import Pod, ServiceAccount
from lightkube.resources.resource_v1 import DeviceClass, ResourceClaim, ResourceSlice

from accel_core.fakehost import build_host

DRIVER = "neuron.aws.com"
RESOURCES = ("resourceslices", "resourceclaims", "nodes")


def api_requests(cp: ControlPlane) -> float:
    """Requests the API server has served so far for the resources the drivers touch."""
    cert, key = cp.pki.client("admin")
    ctx = ssl.create_default_context(cafile=str(cp.ca_cert))
    ctx.load_cert_chain(str(cert), str(key))
    text = urllib.request.urlopen(f"{cp.server}/metrics", context=ctx, timeout=15).read().decode()
    total = 0.0
    for line in text.splitlines():
        if line.startswith("apiserver_request_total{") and any(f'resource="{r}"' in line for r in RESOURCES):
            total += float(line.rsplit(" ", 1)[1])
    return total


def published_nodes(admin: Client) -> set[str]:
    return {s.spec.nodeName for s in admin.list(ResourceSlice) if s.spec.driver == DRIVER and s.spec.devices}


def start_driver(cp: ControlPlane, root: Path, host: Path, node: str) -> subprocess.Popen[bytes]:
    kubelet = root / node / "kubelet"
    log = (root / f"{node}.log").open("wb")
    return subprocess.Popen(
        [console_script("neuron-dra-driver"), "serve", "--host-root", str(host), "--node-name", node,
         "--kubelet-root", str(kubelet), "--device-plugins-dir", str(kubelet / "device-plugins"),
         "--cdi-root", str(root / node / "cdi"), "--kubeconfig", str(cp.admin_kubeconfig), "--metrics-port", "0",
         "--healthcheck-port", "-1", "--rescan-interval", "1", "--log-level", "WARNING"],
        stdout=log, stderr=subprocess.STDOUT)


def schedule_connected_claim(admin: Client, index: int) -> float:
    """Seconds from creating a pod with a 4-connected claim until the scheduler has allocated the claim."""
    name = f"fleet-4c-{index}"
    admin.create(ResourceClaim.from_dict({  # type: ignore[call-overload]
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"devices": {
            "requests": [{"name": "neurons", "exactly": {
                "deviceClassName": DRIVER, "allocationMode": "ExactCount", "count": 4}}],
            "constraints": [{"requests": ["neurons"], "matchAttribute": "resource.aws.com/devicegroup4_id"}]}}}))
    t0 = time.perf_counter()
    admin.create(Pod.from_dict({  # type: ignore[call-overload]
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"containers": [{"name": "app", "image": "busybox", "resources": {"claims": [{"name": "neurons"}]}}],
                 "resourceClaims": [{"name": "neurons", "resourceClaimName": name}]}}))
    try:
        while time.perf_counter() - t0 < 120:
            claim = admin.get(ResourceClaim, name, namespace="default")
            if claim.status is not None and claim.status.allocation is not None:
                return time.perf_counter() - t0
            time.sleep(0.01)
        return float("nan")
    finally:
        admin.delete(Pod, name, namespace="default", grace_period=0)
        admin.delete(ResourceClaim, name, namespace="default")


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--sizes", default="10,25,50", help="fleet sizes, ascending, comma-separated")
    parser.add_argument("--idle", type=float, default=30.0, help="seconds of the idle window per size")
    args = parser.parse_args()
    sizes = sorted({int(s) for s in args.sizes.split(",")})
    if missing_binaries(kube_bin_dir()):
        print("Kubernetes binaries missing (scripts/build-kube.sh): nothing to measure")
        return 0
    rows: list[dict[str, Any]] = []
    procs: dict[str, subprocess.Popen[bytes]] = {}
    with tempfile.TemporaryDirectory(prefix="fleet-", dir="/tmp") as tmp:
        root = Path(tmp)
        fake = build_host(root / "host", "trn2.48xlarge")
        with ControlPlane(root / "cp", with_controller_manager=False) as cp:
            admin = Client(KubeConfig.from_file(cp.admin_kubeconfig))
            # no controller-manager: make the service account pod admission looks up
            admin.create(ServiceAccount.from_dict({"metadata": {"name": "default", "namespace": "default"}}))
            admin.create(DeviceClass.from_dict({  # type: ignore[call-overload]
                "metadata": {"name": DRIVER},
                "spec": {"selectors": [{"cel": {"expression": f"device.driver == '{DRIVER}'"}}]}}))
            try:
                for size in sizes:
                    new = [f"fleet-{i:03d}" for i in range(len(procs), size)]
                    for node in new:
                        cp.create_fake_node(node)
                    t0 = time.perf_counter()
                    for node in new:
                        procs[node] = start_driver(cp, root, fake.root, node)
                    while len(published_nodes(admin)) < size:
                        if time.perf_counter() - t0 > 600:
                            raise TimeoutError(f"only {len(published_nodes(admin))} of {size} nodes published")
                        time.sleep(0.2)
                    publish = time.perf_counter() - t0
                    time.sleep(5)  # let start-up traffic settle
                    before = api_requests(cp)
                    time.sleep(args.idle)
                    idle_per_node = (api_requests(cp) - before) / size
                    before = api_requests(cp)
                    # a device still healthy everywhere (one per size) goes unhealthy on every node
                    fake.set_neuron_counter(len(rows), "stats/hardware/mem_ecc_uncorrected/total", 1)
                    time.sleep(10)  # rescans every 1 s; the slice update and its watch events land well within
                    change_per_node = (api_requests(cp) - before) / size
                    sched = statistics.median(schedule_connected_claim(admin, size * 10 + i) for i in range(3))
                    rss = statistics.mean(rss_mib(p.pid) for p in procs.values())
                    row = {"size": size, "publish": publish, "idle": idle_per_node, "change": change_per_node,
                           "sched": sched, "rss": rss}
                    rows.append(row)
                    print(f"{size:3d} nodes: all slices published {publish:6.1f} s after the new drivers started; "
                          f"API requests per node: {idle_per_node:.2f} in {args.idle:.0f} s idle, "
                          f"{change_per_node:.2f} per health change; scheduler allocates a 4-connected claim in "
                          f"{sched * 1e3:.0f} ms; driver RSS mean {rss:.1f} MiB", flush=True)
            finally:
                for p in procs.values():
                    p.send_signal(signal.SIGTERM)
                for p in procs.values():
                    try:
                        p.wait(timeout=30)
                    except subprocess.TimeoutExpired:
                        p.kill()
                admin.close()
    if len(rows) >= 2:
        first, last = rows[0], rows[-1]
        grow = last["size"] / first["size"]
        new_drivers = (last["size"] - rows[-2]["size"]) / first["size"]
        print(f"growth {first['size']} -> {last['size']} nodes (x{grow:.0f}): publish time "
              f"x{last['publish'] / first['publish']:.2f} (the last step started x{new_drivers:.1f} as many drivers), "
              f"idle requests per node x{last['idle'] / max(first['idle'], 1e-9):.2f}, per change per node "
              f"x{last['change'] / max(first['change'], 1e-9):.2f}, scheduler x{last['sched'] / first['sched']:.2f}, "
              f"RSS per driver x{last['rss'] / first['rss']:.2f}")
    print(f"load average: {', '.join(f'{x:.2f}' for x in os.getloadavg())} on {os.cpu_count()} CPUs")
    return 0


if __name__ == "__main__":
    sys.exit(main())
