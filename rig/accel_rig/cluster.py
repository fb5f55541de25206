"""``accel-cluster``: run the real Kubernetes control plane on 127.0.0.1 in the background for people, with real
kubelet nodes on fake hosts.

    accel-cluster up [--state-dir D] [--node NAME=INSTANCE_TYPE ...] [--runtime fakecri|containerd]
                     [the accelerators' fake-host flags: --lnc 1|2, --no-efa...] [--no-with-scheduler]
                     [--no-with-controller-manager]
    accel-cluster env                 # eval "$(accel-cluster env)": the cluster's kubectl and helm, its KUBECONFIG
    accel-cluster node-env NAME       # KEY=value lines for the daemons: env $(accel-cluster node-env n1) ...
    accel-cluster logs NAMESPACE/POD [-c CONTAINER] [-f] [--tail N] [--previous]   # from the node's /var/log/pods
    accel-cluster status | kubeconfig | down [--purge]

The state directory (default ``${XDG_STATE_HOME:-~/.local/state}/aws-accel-agents/cluster``) keeps the
certificates, the etcd data, the logs, the admin kubeconfig and ``cluster.json`` (ports and PIDs), so a
``down`` followed by ``up`` resumes the same cluster. Each ``--node`` gets ``nodes/<NAME>/``: a fake-sysfs tree of
its instance type and one real kubelet with the fake CRI runtime (see ``accel_rig.kubeletnode``), or with
``--runtime containerd`` a real containerd + runc running real containers from locally built images (see
``accel_rig.containerdnode``; build them with ``make runtime``); an ``up`` with more ``--node`` flags adds
nodes to a running cluster.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shlex
import shutil
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from accel_core.fakehost.parts import cli_options
from accel_core.k8snames import is_label
from accel_rig.containerdnode import FAKECRI_RUNTIME, RUNTIMES
from accel_rig.controlplane import APISERVER, ControlPlane, stop_recorded
from accel_rig.controlplane_errors import ControlPlaneError
from accel_rig.controlplane_pki import Pki
from accel_rig.controlplane_processes import ClusterRecord, recorded_process
from accel_rig.kubeletnode import KubeletNode, stop_recorded_node
from accel_rig.kubeversions import kube_bin_dir
from accel_rig.nodelayout import NodeLayout, NodeRecord
from accel_rig.podlogs import check_pod_names, container_log_files, cri_log_text

NODES_DIR = "nodes"


def default_state_dir() -> Path:
    """``$XDG_STATE_HOME/aws-accel-agents/cluster``, else ``~/.local/state/aws-accel-agents/cluster``."""
    base = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(base) / "aws-accel-agents" / "cluster"


def _node_spec(text: str) -> tuple[str, str]:
    """``NAME=INSTANCE_TYPE`` for ``--node``."""
    name, sep, itype = text.partition("=")
    if not sep or not itype:
        raise argparse.ArgumentTypeError(f"--node wants NAME=INSTANCE_TYPE (a type `fake-sysfs --list` shows); "
                                         f"got {text!r}")
    if not is_label(name, most=32):
        raise argparse.ArgumentTypeError(f"node name {name!r}: lower-case letters, digits and '-', at most 32")
    return name, itype


def node_dirs(state_dir: Path) -> list[Path]:
    """The node directories of a cluster state directory, by name."""
    base = state_dir / NODES_DIR
    return sorted(d for d in base.iterdir() if (d / "node.json").exists()) if base.is_dir() else []


def _host_options(args: argparse.Namespace, instance_type: str) -> dict[str, Any]:
    """The fake-host build options of a node of ``instance_type``: each cluster-wide flag of the accelerators'
    fake-host parts (``--lnc 1``) where its part says it applies to the type, else the part's default."""
    from accel_core.awsfacts.catalog import UnknownInstanceType, get

    try:
        spec = get(instance_type)
    except UnknownInstanceType:
        spec = None  # the host build names the unknown type
    return {opt.option: getattr(args, opt.option) if spec is None or part.applies(spec, opt.option)
            else part.options.get(opt.option) for part, opt in cli_options(cluster_wide_only=True)}


def _refuse_unused(args: argparse.Namespace, options: Mapping[str, Mapping[str, Any]]) -> None:
    """A flag given (not its default) that no node's type takes (``options``: instance type -> its host options)
    is an error naming the flag and the types."""
    for part, opt in cli_options(cluster_wide_only=True):
        given = getattr(args, opt.option)
        if options and given != part.options.get(opt.option) and all(o[opt.option] != given
                                                                        for o in options.values()):
            shown = "" if opt.kwargs.get("action") in ("store_true", "store_false") else f" {given}"
            raise ControlPlaneError(f"{opt.flag}{shown}: none of the nodes' instance types takes it "
                                    f"({', '.join(options)})")


def _start_nodes(args: argparse.Namespace, server: str, pki: Pki) -> None:
    """Start one kubelet node per ``--node``; a failed one is stopped again and the error names it."""
    from accel_core.fakehost import FakeHostError, UnknownInstanceType, build_host

    wanted = {name: (itype, _host_options(args, itype), args.runtime) for name, itype in args.node}
    _refuse_unused(args, {itype: options for itype, options, _ in wanted.values()})
    for node_dir in node_dirs(args.state_dir):  # nodes of an earlier `up` come back too
        old = NodeRecord.load(node_dir)
        if old is not None and old.name not in wanted:
            wanted[old.name] = (old.instance_type, old.host_options, old.runtime)
    for name, (itype, options, runtime) in wanted.items():
        node_dir = args.state_dir / NODES_DIR / name
        record = NodeRecord.load(node_dir)
        if record is not None and any(recorded_process(p) for p in record.processes):
            print(f"accel-cluster: node {name} already running", file=sys.stderr)
            continue
        if record is not None and record.instance_type != itype:
            raise ControlPlaneError(f"node {name} was made as {record.instance_type}, not {itype}; "
                                    "`accel-cluster down --purge` or pick another name")
        layout = NodeLayout(node_dir, runtime)
        if not layout.host_root.exists():
            try:
                build_host(layout.host_root, itype, **options)
            except (UnknownInstanceType, FakeHostError) as e:
                shutil.rmtree(node_dir, ignore_errors=True)
                raise ControlPlaneError(f"node {name}: {e}") from e
        node = KubeletNode(name, node_dir, server=server, pki=pki, bin_dir=kube_bin_dir(), instance_type=itype,
                           host_options=options, detach=True, cert_days=365, verbosity=args.verbosity, runtime=runtime)
        try:
            node.start()
            node.wait_ready(timeout=args.timeout)
        except BaseException:
            node.stop()
            raise
        print(f"accel-cluster: node {name} ({itype}, {runtime}) Ready in {node.ready_seconds:.1f}s; "
              f"env: accel-cluster node-env {name}", file=sys.stderr)


def _up(args: argparse.Namespace) -> int:
    state_dir: Path = args.state_dir
    record = ClusterRecord.load(state_dir)
    if record is not None and any(recorded_process(p) for p in record.processes):
        print(f"accel-cluster: already running from {state_dir}", file=sys.stderr)
        _start_nodes(args, record.server, Pki(state_dir / "pki"))
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
    try:
        _start_nodes(args, cp.server, cp.pki)
    except BaseException:
        _stop_nodes(state_dir)
        cp.stop()
        raise
    print(f"accel-cluster: export KUBECONFIG={cp.admin_kubeconfig}", file=sys.stderr)
    print(cp.admin_kubeconfig)
    return 0


def _stop_nodes(state_dir: Path) -> list[str]:
    stopped: list[str] = []
    for node_dir in node_dirs(state_dir):
        stopped += stop_recorded_node(node_dir)
    return stopped


def _down(args: argparse.Namespace) -> int:
    state_dir: Path = args.state_dir
    stopped = _stop_nodes(state_dir) + stop_recorded(state_dir)
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
    for node_dir in node_dirs(args.state_dir):
        node = NodeRecord.load(node_dir)
        if node is None:
            continue
        live = [p.name for p in node.processes if recorded_process(p) is not None]
        whole = bool(node.processes) and len(live) == len(node.processes)
        state = "running" if whole else ("stopped" if not live else "partly (" + ",".join(live) + ")")
        kubelet = f"kubelet {node.loopback}:{node.ports[0]}" if node.loopback and node.ports else \
            f"kubelet ports={','.join(map(str, node.ports))}"
        print(f"node {node.name:<19} {state:<8} {node.instance_type} ({node.runtime})  {kubelet}  dir={node_dir}")
        all_up = all_up and whole
    return 0 if all_up else 1


def _node_env(args: argparse.Namespace) -> int:
    record = ClusterRecord.load(args.state_dir)
    node_dir = args.state_dir / NODES_DIR / args.name
    if record is None or NodeRecord.load(node_dir) is None:
        print(f"accel-cluster: no node {args.name} in {args.state_dir}; "
              f"run `accel-cluster up --node {args.name}=INSTANCE_TYPE` first", file=sys.stderr)
        return 1
    node = NodeRecord.load(node_dir)
    runtime = node.runtime if node is not None else "fakecri"
    for key, value in NodeLayout(node_dir, runtime).node_env(args.name, Path(record.admin_kubeconfig)).items():
        print(f"{key}={value}")
    return 0


def env_lines(bin_dir: Path, kubeconfig: Path | None) -> list[str]:
    """Shell lines that put the cluster's own kubectl and helm first on PATH and point kubectl at the cluster."""
    out = [f"export PATH={shlex.quote(str(bin_dir))}:\"$PATH\""]
    if kubeconfig is not None:
        out.append(f"export KUBECONFIG={shlex.quote(str(kubeconfig))}")
    return out


def _env(args: argparse.Namespace) -> int:
    record = ClusterRecord.load(args.state_dir)
    kubeconfig = Path(record.admin_kubeconfig) if record is not None else None
    print("\n".join(env_lines(kube_bin_dir(), kubeconfig)))
    if kubeconfig is None:
        print(f"accel-cluster: no cluster in {args.state_dir}; KUBECONFIG not set (run `accel-cluster up`)",
              file=sys.stderr)
        return 1
    return 0


def pick_log_files(runs: list[list[Path]], previous: bool) -> list[Path]:
    """The files ``accel-cluster logs`` prints: every run of every pod of the name (oldest first), or with
    ``previous`` only the run before the newest of the newest pod (ValueError when there is none)."""
    if not previous:
        return [f for files in runs for f in files]
    if not runs or len(runs[-1]) < 2:
        raise ValueError("no previous run of that container (it has not restarted)")
    return [runs[-1][-2]]


def tail_lines(lines: list[str], tail: int | None) -> list[str]:
    """The last ``tail`` lines (all with None or a negative count, as ``kubectl logs --tail=-1``)."""
    return lines if tail is None or tail < 0 else lines[max(0, len(lines) - tail):]


def _follow(runs: list[list[Path]], offset: int, poll: float = 0.3) -> None:
    """Print what the newest run of the newest pod writes from ``offset`` on, until that pod's logs are removed
    (the pod is gone) or Ctrl-C; a later run (a restart) is followed from its start."""
    pod_dir = runs[-1][-1].parent if runs and runs[-1] else None
    if pod_dir is None:
        return
    current, pending = runs[-1][-1], ""
    while pod_dir.is_dir():
        try:
            with current.open("rb") as f:
                f.seek(offset)
                data = f.read()
        except OSError:
            data = b""
        offset += len(data)
        text = pending + data.decode("utf-8", "replace")
        *complete, pending = text.split("\n")
        if complete:
            sys.stdout.write("".join(cri_log_text(complete)))
            sys.stdout.flush()
        newer = sorted((p for p in pod_dir.glob("*.log") if p.stem.isdecimal() and int(p.stem) > int(current.stem)),
                       key=lambda p: int(p.stem))
        if newer and not data:
            current, offset, pending = newer[0], 0, ""
            continue
        time.sleep(poll)


def _logs(args: argparse.Namespace) -> int:
    namespace, sep, pod = args.pod.partition("/")
    if not sep or not namespace or not pod:
        print(f"accel-cluster: logs wants NAMESPACE/POD, got {args.pod!r}", file=sys.stderr)
        return 2
    try:
        check_pod_names(namespace, pod, args.container)  # before the names go into a glob
    except ValueError as e:
        print(f"accel-cluster: {e}", file=sys.stderr)
        return 2
    runs: list[list[Path]] = []
    for node_dir in node_dirs(args.state_dir):
        pod_logs = node_dir / "var-log" / "pods"
        containers = sorted({d.name for d in pod_logs.glob(f"{namespace}_{pod}_*/*") if d.is_dir()}) \
            if pod_logs.is_dir() else []
        if not containers:
            continue
        wanted = args.container or containers[0]
        if args.container is None and len(containers) > 1:
            print(f"accel-cluster: {args.pod} has containers {', '.join(containers)}; showing {wanted} (-c to choose)",
                  file=sys.stderr)
        runs += container_log_files(pod_logs, namespace, pod, wanted)
    runs = sorted((r for r in runs if r), key=lambda r: r[-1].stat().st_mtime)
    if not runs:
        print(f"accel-cluster: no logs of {args.pod} on any node of {args.state_dir} (only containerd nodes keep "
              "container output)", file=sys.stderr)
        return 1
    try:
        files = pick_log_files(runs, args.previous)
    except ValueError as e:
        print(f"accel-cluster: {args.pod}: {e}", file=sys.stderr)
        return 1
    raw: list[str] = []
    for f in files:
        try:
            raw += f.read_bytes().decode("utf-8", "replace").splitlines()
        except OSError:
            continue
    sys.stdout.write("".join(tail_lines(cri_log_text(raw), args.tail)))
    sys.stdout.flush()
    if args.follow and not args.previous:
        try:
            size = runs[-1][-1].stat().st_size
        except OSError:
            size = 0
        with contextlib.suppress(KeyboardInterrupt):
            _follow(runs, size)
    return 0


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
    up.add_argument("--node", type=_node_spec, action="append", default=[], metavar="NAME=INSTANCE_TYPE",
                    help="run a real kubelet node on a fake host of that instance type (repeatable)")
    for _part, option in cli_options(cluster_wide_only=True):  # the accelerators' fake-host flags (--lnc, --no-efa)
        option.add_to(up, help=f"the nodes' fake hosts: {option.kwargs.get('help', option.option)}")
    up.add_argument("--runtime", choices=RUNTIMES, default=FAKECRI_RUNTIME,
                    help="container runtime of the new nodes: fakecri (records what a container would get; the fast "
                         "default) or containerd (real containers; `make runtime` builds it)")
    up.set_defaults(func=_up)
    down = sub.add_parser("down", parents=[common], help="stop the control plane")
    down.add_argument("--purge", action="store_true", help="also delete the state directory")
    down.set_defaults(func=_down)
    kc = sub.add_parser("kubeconfig", parents=[common], help="print the admin kubeconfig path")
    kc.set_defaults(func=_kubeconfig)
    st = sub.add_parser("status", parents=[common], help="show the components and their PIDs")
    st.set_defaults(func=_status)
    env = sub.add_parser("node-env", parents=[common], help="print KEY=value lines that point a daemon at a node")
    env.add_argument("name", help="node name given to up --node")
    env.set_defaults(func=_node_env)
    logs = sub.add_parser("logs", parents=[common], help="print a container's output (containerd nodes)")
    logs.add_argument("pod", metavar="NAMESPACE/POD")
    logs.add_argument("-c", "--container", help="container name (default: the first)")
    logs.add_argument("-f", "--follow", action="store_true", help="keep printing what the container writes")
    logs.add_argument("--tail", type=int, metavar="N", help="only the last N lines (before following)")
    logs.add_argument("-p", "--previous", action="store_true",
                      help="the container's run before the current one (after a restart)")
    ev = sub.add_parser("env", parents=[common],
                        help='print shell lines for eval "$(accel-cluster env)": the cluster\'s kubectl and helm '
                             "first on PATH, KUBECONFIG")
    ev.set_defaults(func=_env)
    logs.set_defaults(func=_logs)
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
