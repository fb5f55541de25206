"""``accel-cluster``: run the real Kubernetes control plane on 127.0.0.1 in the background for people.

    accel-cluster up [--state-dir D] [--no-with-scheduler] [--no-with-controller-manager]
    accel-cluster status | kubeconfig | down [--purge]

The state directory (default ``${XDG_STATE_HOME:-~/.local/state}/aws-accel-agents/cluster``) keeps the
certificates, the etcd data, the logs, the admin kubeconfig and ``cluster.json`` (ports and PIDs), so a
``down`` followed by ``up`` resumes the same cluster.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
from collections.abc import Sequence
from pathlib import Path

from accel_core.devtools.controlplane import (
    APISERVER,
    ClusterRecord,
    ControlPlane,
    ControlPlaneError,
    recorded_process,
    stop_recorded,
)


def default_state_dir() -> Path:
    """``$XDG_STATE_HOME/aws-accel-agents/cluster``, else ``~/.local/state/aws-accel-agents/cluster``."""
    base = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(base) / "aws-accel-agents" / "cluster"


def _up(args: argparse.Namespace) -> int:
    state_dir: Path = args.state_dir
    record = ClusterRecord.load(state_dir)
    if record is not None and any(recorded_process(p) for p in record.processes):
        print(f"accel-cluster: already running from {state_dir}", file=sys.stderr)
        print(record.admin_kubeconfig)
        return 0
    cp = ControlPlane(
        state_dir,
        with_scheduler=args.with_scheduler,
        with_controller_manager=args.with_controller_manager,
        detach=True,
        startup_timeout=args.timeout,
        etcd_fsync=True,
        cert_days=365,
        verbosity=args.verbosity,
    )
    cp.start()
    print(f"accel-cluster: API server {cp.server} ready; logs in {cp.log_dir}", file=sys.stderr)
    print(f"accel-cluster: export KUBECONFIG={cp.admin_kubeconfig}", file=sys.stderr)
    print(cp.admin_kubeconfig)
    return 0


def _down(args: argparse.Namespace) -> int:
    state_dir: Path = args.state_dir
    stopped = stop_recorded(state_dir)
    print(f"accel-cluster: stopped {', '.join(stopped)}" if stopped else "accel-cluster: nothing was running")
    if args.purge and state_dir.exists():
        if ClusterRecord.load(state_dir) is None and not (state_dir / "pki").exists():
            print(f"accel-cluster: {state_dir} does not look like a cluster state dir; not removing it")
            return 1
        shutil.rmtree(state_dir)
        print(f"accel-cluster: removed {state_dir}")
    return 0


def _kubeconfig(args: argparse.Namespace) -> int:
    record = ClusterRecord.load(args.state_dir)
    if record is None or not Path(record.admin_kubeconfig).exists():
        print(f"accel-cluster: no cluster in {args.state_dir}; run `accel-cluster up` first", file=sys.stderr)
        return 1
    print(record.admin_kubeconfig)
    return 0


def _status(args: argparse.Namespace) -> int:
    record = ClusterRecord.load(args.state_dir)
    if record is None:
        print(f"accel-cluster: no cluster in {args.state_dir}")
        return 1
    running = {p.name: p for p in record.processes if recorded_process(p) is not None}
    for p in record.processes:
        state = "running" if p.name in running else "stopped"
        print(f"{p.name:<24} {state:<8} pid={p.pid:<8} ports={','.join(map(str, p.ports))}  log={p.log}")
    if not record.processes:
        print("no components running")
    if APISERVER in running:
        print(f"server: {record.server}")
        print(f"kubeconfig: {record.admin_kubeconfig}")
    all_up = bool(record.processes) and len(running) == len(record.processes)
    return 0 if all_up else 1


def _parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--state-dir", type=Path, default=default_state_dir(), help="state directory (default: %(default)s)"
    )
    parser = argparse.ArgumentParser(prog="accel-cluster", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    up = sub.add_parser("up", parents=[common], help="start the control plane in the background")
    up.add_argument("--with-scheduler", action=argparse.BooleanOptionalAction, default=True)
    up.add_argument("--with-controller-manager", action=argparse.BooleanOptionalAction, default=True)
    up.add_argument("--timeout", type=float, default=120.0, help="seconds to wait for each component")
    up.add_argument("--verbosity", type=int, default=0, help="klog -v level of the kube components")
    up.set_defaults(func=_up)
    down = sub.add_parser("down", parents=[common], help="stop the control plane")
    down.add_argument("--purge", action="store_true", help="also delete the state directory")
    down.set_defaults(func=_down)
    kc = sub.add_parser("kubeconfig", parents=[common], help="print the admin kubeconfig path")
    kc.set_defaults(func=_kubeconfig)
    st = sub.add_parser("status", parents=[common], help="show the components and their PIDs")
    st.set_defaults(func=_status)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    args.state_dir = args.state_dir.expanduser().resolve()
    try:
        code: int = args.func(args)
    except ControlPlaneError as e:
        print(f"accel-cluster: {e}", file=sys.stderr)
        return 1
    return code


if __name__ == "__main__":
    sys.exit(main())
