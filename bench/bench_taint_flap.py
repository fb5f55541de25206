"""ResourceSlice writes per minute while an EFA port flaps every 0.2 s, before and after the taint hysteresis.

``efa-dra-driver serve --unhealthy-taint-effect NoExecute`` runs as a process against a real kube-apiserver on a
fake p4d.24xlarge host (4 EFAs) and a fake Node; one port is set DOWN and ACTIVE in turn every 0.2 s (the fake host
raises an inotify event per change, so the driver sees nearly every flip). The API server's own watch counts the
slice writes (ADDED/MODIFIED/DELETED events of the node's slices) and the NoExecute taints that appear (a device
going from no NoExecute taint to one: an eviction for the pods using it). Runs, one after another:

1. ``before``: the code of ``--before-rev`` (default: the commit before the hysteresis) from a git worktree;
2. ``off``: today's code with ``--noexecute-after 0 --min-slice-write-interval 0`` (the old behaviour);
3. ``after``: today's code with its defaults (30 s hold, 5 s between taint-only writes).

    PYTHONPATH=. .venv/bin/python bench/bench_taint_flap.py [--seconds 60] [--before-rev 37d25cd]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

from accel_rig.controlplane import ControlPlane
from accel_rig.kubeversions import kube_bin_dir, missing_binaries
from lightkube import Client, KubeConfig
from lightkube.resources.resource_v1 import ResourceSlice

from accel_core.fakehost import build_host

REPO = Path(__file__).resolve().parents[1]
DRIVER = "efa.aws.com"
FLAP = 0.2


@contextlib.contextmanager
def worktree(rev: str, where: Path) -> Iterator[Path]:
    subprocess.run(["git", "-C", str(REPO), "worktree", "add", "-q", "--detach", str(where), rev], check=True)
    try:
        yield where
    finally:
        subprocess.run(["git", "-C", str(REPO), "worktree", "remove", "--force", str(where)], check=False)


def count_events(client: Client, node: str, stop: threading.Event, out: dict[str, int]) -> None:
    """Slice write events and NoExecute taints that appear, from the API server's watch."""
    no_execute: set[str] = set()
    fields = {"spec.nodeName": node, "spec.driver": DRIVER}
    with contextlib.suppress(Exception):  # the watch ends with the API server, after the counting
        for _event, obj in client.watch(ResourceSlice, fields=fields, resource_version=out.pop("rv", None)):
            if stop.is_set():
                return
            out["writes"] += 1
            now = {d["name"] for d in obj.to_dict()["spec"].get("devices") or []
                   if any(t["effect"] == "NoExecute" for t in d.get("taints") or [])}
            out["no_execute"] += len(now - no_execute)
            no_execute = now


def run(cp: ControlPlane, client: Client, root: Path, label: str, code: Path, seconds: float,
        flags: list[str]) -> tuple[float, float]:
    node = f"flap-{label}"
    cp.create_fake_node(node)
    host = build_host(root / label / "host", "p4d.24xlarge")
    ibdev = sorted(p.name for p in (host.root / "sys/class/infiniband").iterdir())[0]
    env = {**{k: v for k, v in os.environ.items() if k != "KUBECONFIG"}, "PYTHONPATH": str(code),
           "NODE_NAME": node, "POD_UID": f"pod-{label}", "KUBECONFIG": str(cp.admin_kubeconfig)}
    log = (root / f"{label}.log").open("wb")
    proc = subprocess.Popen(
        [sys.executable, "-m", "efa_plugin.dra.cli", "serve", "--host-root", str(host.root),
         "--kubelet-root", str(root / label / "kubelet"), "--cdi-root", str(root / label / "cdi"),
         "--device-plugins-dir", str(root / label / "kubelet" / "device-plugins"), "--metrics-port", "0",
         "--healthcheck-port", "-1", "--unhealthy-taint-effect", "NoExecute", *flags],
        env=env, stdout=log, stderr=subprocess.STDOUT, cwd=str(code))
    try:
        deadline = time.monotonic() + 60
        while not list(client.list(ResourceSlice, fields={"spec.nodeName": node, "spec.driver": DRIVER})):
            if time.monotonic() > deadline or proc.poll() is not None:
                raise SystemExit(f"{label}: no slices published; see {root / f'{label}.log'}")
            time.sleep(0.2)
        time.sleep(2)  # settled
        listing = client.list(ResourceSlice, fields={"spec.nodeName": node, "spec.driver": DRIVER})
        list(listing)
        counts = {"writes": 0, "no_execute": 0, "rv": listing.resourceVersion}  # type: ignore[dict-item]
        stop = threading.Event()
        watcher = threading.Thread(target=count_events, args=(client, node, stop, counts), daemon=True)
        watcher.start()
        end = time.monotonic() + seconds
        down = False
        while time.monotonic() < end:
            down = not down
            host.set_port_state(ibdev, "DOWN" if down else "ACTIVE")
            time.sleep(FLAP)
        host.set_port_state(ibdev, "ACTIVE")
        time.sleep(0.5)
        stop.set()
        scale = 60.0 / seconds
        return counts["writes"] * scale, counts["no_execute"] * scale
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        log.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=60.0, help="flap this long per run (default 60)")
    parser.add_argument("--before-rev", default="37d25cd", help="the code before the hysteresis (git revision)")
    args = parser.parse_args()
    if missing_binaries(kube_bin_dir()):
        print("the Kubernetes binaries are missing: scripts/build-kube.sh", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="taint-flap-", dir="/tmp") as tmp:
        root = Path(tmp)
        with ControlPlane(root / "cp", with_controller_manager=False, with_scheduler=False) as cp:
            client = Client(KubeConfig.from_file(cp.admin_kubeconfig), field_manager="bench")
            results = []
            with worktree(args.before_rev, root / "before-code") as old:
                results.append(("before", f"rev {args.before_rev}", run(cp, client, root, "before", old,
                                                                        args.seconds, [])))
            results.append(("off", "--noexecute-after 0 --min-slice-write-interval 0",
                            run(cp, client, root, "off", REPO, args.seconds,
                                ["--noexecute-after", "0", "--min-slice-write-interval", "0"])))
            results.append(("after", "defaults (30 s hold, 5 s interval)",
                            run(cp, client, root, "after", REPO, args.seconds, [])))
    print(f"one EFA port flapping every {FLAP} s for {args.seconds:g} s, --unhealthy-taint-effect NoExecute:")
    for label, how, (writes, no_execute) in results:
        print(f"[figure] {label:6} {how:52} {writes:6.1f} slice writes/min, {no_execute:6.1f} NoExecute taints/min")
    return 0


if __name__ == "__main__":
    sys.exit(main())
