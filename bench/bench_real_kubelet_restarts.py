"""Memory of a device plugin across restarts of the REAL kubelet (issue 25 item 9), the way a node sees them:
``systemctl restart kubelet`` stops the kubelet (its ListAndWatch streams, up since the last start, end with it),
the new kubelet deletes every socket in device-plugins/, the plugin serves and registers again, and the kubelet
opens new streams. One real control plane and one kubelet node (fakecri), the daemon as its own process under
``rig/accel_rig/heapprobe.py``; each restart waits until the kubelet's log shows every resource registered
again, then ``--settle`` seconds.

    PYTHONPATH=. .venv/bin/python bench/bench_real_kubelet_restarts.py [--restarts 200] [--warmup 20]
        [--daemon neuron|efa] [--settle 1.0]

Prints the daemon's malloc heap in use and RSS after the warm-up and at each quarter. Needs root and the built
binaries (make kube). Nothing is asserted. bench_kubelet_restarts.py runs thousands of restarts against the
in-process stand-in instead (a real kubelet restart takes about a second or more here).
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(1, str(REPO / "tests"))  # the daemons' table

from accel_rig.controlplane import ControlPlane  # noqa: E402
from accel_rig.heapprobe import growth_report, resident_by_kind, sample, wrap  # noqa: E402
from accel_rig.kubeletnode import KubeletNode  # noqa: E402
from accel_rig.polling import poll_until  # noqa: E402
from probed_daemon import DAEMONS  # noqa: E402

from accel_core.fakehost import build_host  # noqa: E402

SCRIPTS = {"neuron": "neuron-device-plugin", "efa": "efa-device-plugin"}


def wait_registered(node: KubeletNode, resources: tuple[str, ...], timeout: float) -> None:
    """Until the running kubelet's log shows every resource registered."""
    poll_until(lambda: all(node.device_plugin_registrations(r) >= 1 for r in resources),
               f"{resources} registered with the kubelet (log {node.kubelet_log})", timeout, interval=0.02)


def restart(node: KubeletNode, resources: tuple[str, ...], settle: float) -> None:
    node.restart_kubelet()
    wait_registered(node, resources, timeout=120)
    time.sleep(settle)  # the kubelet's streams get their first lists and stay up a while, as between real restarts


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--restarts", type=int, default=200)
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--daemon", choices=sorted(SCRIPTS), default="neuron")
    parser.add_argument("--settle", type=float, default=1.0,
                        help="seconds between a registration and the next restart (0: restart at once, so the "
                             "kubelet often ends its streams inside their first write: grpc/grpc#43360)")
    parser.add_argument("--daemon-log-level", default="WARNING", help="the daemon's --log-level")
    args = parser.parse_args()
    if os.geteuid() != 0:
        print("needs root (the kubelet runs in a private mount namespace)")
        return 1
    script = SCRIPTS[args.daemon]
    itype, resources = DAEMONS[script]
    with tempfile.TemporaryDirectory(prefix="brk-", dir="/dev/shm" if os.access("/dev/shm", os.W_OK) else None) as tmp:
        work = Path(tmp)
        with ControlPlane(work / "cp") as cp:
            node = KubeletNode("n1", work / "n1", server=cp.server, pki=cp.pki, bin_dir=cp.bin_dir,
                               instance_type=itype)
            build_host(node.layout.host_root, itype)
            node.start()
            node.wait_ready()
            heap = work / "heap.txt"
            with (work / "daemon.log").open("wb") as log:
                proc = subprocess.Popen(wrap(heap, script, "serve", "--metrics-port", "0",
                                             "--log-level", args.daemon_log_level),
                                        env={**os.environ, **node.daemon_env(cp.admin_kubeconfig)}, stdout=log,
                                        stderr=subprocess.STDOUT)
            try:
                child = psutil.Process(proc.pid)
                wait_registered(node, resources, timeout=60)
                for _ in range(args.warmup):
                    restart(node, resources, args.settle)
                time.sleep(1)
                heaps, rss = [sample(proc.pid, heap)], [child.memory_info().rss]
                maps = [resident_by_kind(proc.pid)]
                t0 = time.perf_counter()
                for _ in range(4):
                    for _ in range(args.restarts // 4):
                        restart(node, resources, args.settle)
                    time.sleep(1)
                    heaps.append(sample(proc.pid, heap))
                    rss.append(child.memory_info().rss)
                    maps.append(resident_by_kind(proc.pid))
                took = (time.perf_counter() - t0) / args.restarts
            except BaseException:
                kept = Path(tempfile.mkdtemp(prefix="brk-failed-"))
                shutil.copy(work / "daemon.log", kept)
                shutil.copy(node.kubelet_log, kept)
                print(f"failed: the daemon's and the kubelet's logs are kept in {kept}", file=sys.stderr)
                raise
            finally:
                proc.terminate()
                proc.wait(30)
                node.stop()
    print(f"{script} across real kubelet restarts ({took:.2f} s each, {args.settle:g} s settle), after "
          f"{args.warmup} warm-up restarts then every {args.restarts // 4}:")
    print("  malloc heap in use MB: " + " ".join(f"{h / 1e6:.3f}" for h in heaps) +
          f"  ({(heaps[-1] - heaps[0]) / 1e6:+.3f} MB, {(heaps[-1] - heaps[0]) / args.restarts:+.0f} B per restart)")
    print("  RSS MB:                " + " ".join(f"{r / 1e6:.2f}" for r in rss) +
          f"  ({(rss[-1] - rss[0]) / 1e6:+.2f} MB)")
    print("\n".join(growth_report(maps)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
