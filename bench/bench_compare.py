"""Our daemons side by side with their Go peers and with no-op floors, in one run, under one client.

Device plugins (``compare_dp.py``): EFA and Neuron against the Kubernetes sample device plugin
(k8s.io/kubernetes test/images/sample-device-plugin), a no-op Go plugin and a no-op Python plugin:
start -> Register, Allocate and GetPreferredAllocation p50 (calls interleaved plugin by plugin), idle CPU over one
shared window, RSS, and how fast a health change reaches ListAndWatch.
DRA (``compare_dra.py``): the Neuron DRA driver against k8s.io/kubernetes test/e2e/dra/test-driver against one real
kube-apiserver: NodePrepareResources p50 for 1 claim and a batch of 8, start -> registration and -> slices, idle
CPU, RSS.

Prints one table: each figure with ours, the Go peer, ours/Go, the Python floor, how far above it we are, the Go
floor, the target and whether it is met. Needs ``scripts/build-kube-peers.sh`` (``make bench-compare`` runs it) and,
for the DRA part, ``scripts/build-kube.sh``.

    .venv/bin/python bench/bench_compare.py [--calls 300] [--starts 5] [--idle 30] [--dra-iterations 50] [--no-dra]
        [--baseline REV]

``--baseline REV`` also runs our daemons as of git revision REV (a temporary worktree), interleaved with this
checkout's in the same rounds, and prints a second table: this tree / baseline per figure, with a 1.10x limit.
"""

from __future__ import annotations

import argparse
import asyncio
import compileall
import contextlib
import os
import shutil
import sys
import tempfile
from pathlib import Path

import compare_dp
import compare_dra
from accel_rig.kubeversions import kube_bin_dir, missing_binaries
from compare_common import REPO, Table, Versus, baseline_tree, missing_peers, peers_bin_dir

PACKAGES = ("accel_core", "efa_plugin", "neuron_dra")


def compile_bytecode(tree: Path = REPO) -> None:
    """Write our packages' bytecode first, as the image has it (pip compiles at install): with
    PYTHONDONTWRITEBYTECODE set, an editable checkout would otherwise compile every module from source on every
    start, which is no part of what a node pays."""
    for package in PACKAGES:
        compileall.compile_dir(str(tree / package), quiet=1)


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=300, help="Allocate and GetPreferredAllocation calls per plugin")
    parser.add_argument("--starts", type=int, default=5,
                        help="starts per plugin for start -> Register, and per DRA driver for start -> slices")
    parser.add_argument("--idle", type=float, default=30.0, help="seconds of the idle-CPU window")
    parser.add_argument("--dra-iterations", type=int, default=50, help="prepare rounds per DRA driver")
    parser.add_argument("--no-dra", action="store_true", help="device plugins only")
    parser.add_argument("--no-device-plugins", action="store_true", help="DRA drivers only")
    parser.add_argument("--baseline", metavar="REV", help="also run our daemons as of this git revision")
    args = parser.parse_args()
    peers = peers_bin_dir()
    missing = missing_peers(peers)
    if missing:
        print(f"Go peers missing in {peers}: {', '.join(missing)}; run scripts/build-kube-peers.sh "
              "(make bench-compare does)")
        return 0
    if os.geteuid() != 0:
        print("the sample device plugin runs in a private mount namespace (unshare --mount): run as root")
        return 0
    compile_bytecode()
    with contextlib.ExitStack() as stack:
        versus = None
        if args.baseline:
            tree = stack.enter_context(baseline_tree(args.baseline))
            compile_bytecode(tree)
            versus = (tree, Versus(args.baseline))
        return run_all(args, peers, versus)


def run_all(args: argparse.Namespace, peers: Path, versus: tuple[Path, Versus] | None) -> int:
    table = Table()
    root = Path(tempfile.mkdtemp(prefix="cmp-", dir="/tmp"))
    try:
        print(f"load average before: {', '.join(f'{x:.2f}' for x in os.getloadavg())} on {os.cpu_count()} CPUs")
        if not args.no_device_plugins:
            asyncio.run(compare_dp.run(root / "dp", peers, table, calls=args.calls, starts=args.starts,
                                       idle=args.idle, versus=versus))
        if args.no_dra:
            pass
        elif missing_binaries(kube_bin_dir()):
            print("Kubernetes binaries missing (scripts/build-kube.sh): DRA part skipped")
        else:
            asyncio.run(compare_dra.run(root / "dra", peers, table, iterations=args.dra_iterations, idle=args.idle,
                                        starts=args.starts, versus=versus))
        print(f"load average after: {', '.join(f'{x:.2f}' for x in os.getloadavg())}")
        print(table.render())
        if versus is not None:
            print(f"\nthis tree against {args.baseline}, side by side in the same run:")
            print(versus[1].render())
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
