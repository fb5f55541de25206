"""How long the real control plane takes to come up with cached binaries.

Measures ``ControlPlane.start()`` in a fresh temp dir (certificates included) until the API server answers
/readyz and kube-scheduler (and, with --with-controller-manager, kube-controller-manager) answers /healthz,
then the time ``stop()`` takes. Prints one line per run and the medians.

    PYTHONPATH=. .venv/bin/python bench/bench_cluster_up.py [--runs 3] [--with-controller-manager]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

from accel_rig.controlplane import ControlPlane
from accel_rig.controlplane_errors import ControlPlaneError


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--with-controller-manager", action="store_true")
    args = parser.parse_args()
    ups: list[float] = []
    downs: list[float] = []
    for run in range(1, args.runs + 1):
        cp = ControlPlane(with_scheduler=True, with_controller_manager=args.with_controller_manager)
        t0 = time.perf_counter()
        try:
            cp.start()
        except ControlPlaneError as e:
            print(f"run {run}: start failed: {e}", file=sys.stderr)
            cp.close()
            return 1
        up = time.perf_counter() - t0
        steps = ", ".join(f"{k} {v:.2f}s" for k, v in cp.startup_times.items())
        t1 = time.perf_counter()
        cp.close()
        down = time.perf_counter() - t1
        ups.append(up)
        downs.append(down)
        print(f"run {run}: up {up:.2f}s ({steps}); stop {down:.2f}s")
    parts = "etcd+apiserver+scheduler" + ("+controller-manager" if args.with_controller_manager else "")
    print(
        f"cluster up ({parts}, cached binaries): median {statistics.median(ups):.2f}s "
        f"(min {min(ups):.2f}s, max {max(ups):.2f}s, {args.runs} runs); stop median {statistics.median(downs):.2f}s"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
