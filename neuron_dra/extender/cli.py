"""``neuron-scheduler-extender``: ``serve`` (the HTTP extender kube-scheduler calls) and ``explain`` (does a pod fit
a node, and why not)."""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
from collections.abc import Sequence
from pathlib import Path

import yaml
from lightkube import AsyncClient
from lightkube.core.exceptions import ConfigError
from lightkube.resources.core_v1 import Node, Pod
from prometheus_client import CollectorRegistry

from accel_core.cli import EnvArgumentParser, add_logging_flags, ip_address, port, safe_stdout, seconds
from accel_core.daemon import run_daemon
from accel_core.kubeconfig import KubeconfigError, load_kubeconfig
from accel_core.logs import kv, setup_logging
from accel_core.metrics_http import serve_metrics
from neuron_dra.deviceusage import USAGE_ANNOTATION
from neuron_dra.extender.decide import Decider, explain
from neuron_dra.extender.podspec import BadInput, pod_info
from neuron_dra.extender.service import ExtenderService, serve

log = logging.getLogger(__name__)

PROG = "neuron-scheduler-extender"
PORT = 12345  # the port the AWS Neuron scheduler extension uses
METRICS_PORT = 9813


def build_parser() -> EnvArgumentParser:
    parser = EnvArgumentParser(prog=PROG, description="kube-scheduler extender placing Neuron pods on connected "
                                                      "device sets")
    sub = parser.add_subparsers(dest="command", required=True)
    srv = sub.add_parser("serve", help="serve the extender's filter and prioritize verbs")
    srv.add_env_argument("--port", env="PORT", type=port, default=PORT, help=f"HTTP port (env PORT; default {PORT})")
    srv.add_env_argument("--address", env="ADDRESS", type=ip_address, default="0.0.0.0",
                         help="address to listen on (env ADDRESS; default all)")
    srv.add_env_argument("--metrics-port", env="METRICS_PORT", type=port, default=METRICS_PORT,
                         help=f"Prometheus /metrics port (env METRICS_PORT; default {METRICS_PORT}; 0 disables)")
    srv.add_env_argument("--metrics-address", env="METRICS_ADDRESS", type=ip_address, default="0.0.0.0",
                         help="address of the metrics server (env METRICS_ADDRESS; default all)")
    srv.add_env_argument("--reserve-for", env="RESERVE_FOR", type=seconds, default=15.0,
                         help="seconds a pod passed to nodes counts against them until it is bound "
                              "(env RESERVE_FOR; default 15)")
    srv.add_argument("--kubeconfig", default=None, help="kubeconfig (default: KUBECONFIG, then in-cluster)")
    add_logging_flags(srv)
    exp = sub.add_parser("explain", help="say whether a pod fits a node and why (reads the Node and its pods)")
    exp.add_argument("--node", required=True, help="node name")
    exp.add_argument("--pod", required=True, type=Path, help="pod manifest (YAML or JSON; '-' for stdin)")
    exp.add_argument("--kubeconfig", default=None, help="kubeconfig (default: KUBECONFIG, then in-cluster)")
    add_logging_flags(exp, level="WARNING")
    return parser


def _client(kubeconfig: str | None) -> AsyncClient:
    return AsyncClient(load_kubeconfig(kubeconfig), field_manager=PROG)


def _serve(args: argparse.Namespace) -> int:
    setup_logging(args.log_level, args.log_format)
    try:
        load_kubeconfig(args.kubeconfig)
    except KubeconfigError as exc:  # a file is named but it is no kubeconfig: a setting to fix
        print(f"{PROG} serve: error: {exc}", file=sys.stderr)
        return 2
    except (ConfigError, OSError, ValueError):
        pass  # none at all: serve logs it and runs without counting bound pods
    registry = CollectorRegistry()
    metrics = serve_metrics(registry, args.metrics_port, args.metrics_address)

    async def main(stop: asyncio.Event) -> None:
        client: AsyncClient | None
        try:
            client = _client(args.kubeconfig)
        except (ConfigError, OSError, ValueError) as exc:
            log.error("no usable API server configuration; bound pods are not counted",
                                              extra=kv(error=exc))
            client = None
        service = ExtenderService(Decider(reserve_for=args.reserve_for), registry, client)
        try:
            await serve(service, args.address, args.port, stop)
        finally:
            if client is not None:
                await client.close()
            if metrics is not None:
                metrics.shutdown()

    return run_daemon(main, PROG)


def _explain(args: argparse.Namespace) -> int:
    setup_logging(args.log_level, args.log_format)
    safe_stdout()
    try:
        text = sys.stdin.read() if str(args.pod) == "-" else args.pod.read_text()
        raw = yaml.safe_load(text)
        pod = pod_info(raw)
    except (OSError, yaml.YAMLError, BadInput) as exc:
        print(f"{PROG}: cannot read pod {args.pod}: {exc}", file=sys.stderr)
        return 2

    async def main() -> int:
        client = _client(args.kubeconfig)
        try:
            node = await client.get(Node, args.node)
            annotations = (node.metadata.annotations if node.metadata else None) or {}
            decider = Decider()
            async for other in client.list(Pod, namespace="*", fields={"spec.nodeName": args.node}):
                try:
                    decider.pod_seen(pod_info(other.to_dict()))
                except BadInput:
                    continue
            verdict = decider.verdict(pod, args.node, annotations.get(USAGE_ANNOTATION))
            print(explain(pod, args.node, verdict))
            return 0 if verdict.fits else 1
        finally:
            await client.close()

    try:
        return asyncio.run(main())
    except (ConfigError, OSError, ValueError) as exc:
        print(f"{PROG}: {exc}", file=sys.stderr)
        return 2
    except Exception as exc:  # lightkube ApiError and friends
        print(f"{PROG}: node {args.node}: {exc}", file=sys.stderr)
        return 2


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return _serve(args) if args.command == "serve" else _explain(args)


if __name__ == "__main__":
    sys.exit(main())
