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
from neuron_dra.accelerator import EXTENDER
from neuron_dra.extender.decide import Decider, explain
from neuron_dra.extender.podspec import BadInput, device_plugin_away, pod_info
from neuron_dra.extender.reservations import MAX_NODE_ENTRIES, MAX_PER_NAMESPACE, MAX_PODS
from neuron_dra.extender.service import ExtenderService, serve
from neuron_dra.extender.tls import FollowedTls, TlsConfigError
from neuron_dra.usage_annotation import USAGE_ANNOTATION

log = logging.getLogger(__name__)

PROG = "neuron-scheduler-extender"
PORT = 12345  # the port the AWS Neuron scheduler extension uses
METRICS_PORT = EXTENDER.metrics_port


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
    srv.add_env_argument("--max-reservations", env="MAX_RESERVATIONS", type=_count, default=MAX_PODS,
                         help=f"most pods reserved at once; past it new reservations are refused, with a warning "
                              f"(env MAX_RESERVATIONS; default {MAX_PODS})")
    srv.add_env_argument("--max-reservations-per-namespace", env="MAX_RESERVATIONS_PER_NAMESPACE", type=_count,
                         default=MAX_PER_NAMESPACE,
                         help=f"most pods of one namespace reserved at once (and the same share of "
                              f"--max-reserved-nodes); past it the namespace's own oldest reservation goes "
                              f"(env MAX_RESERVATIONS_PER_NAMESPACE; default {MAX_PER_NAMESPACE})")
    srv.add_env_argument("--max-reserved-nodes", env="MAX_RESERVED_NODES", type=_count, default=MAX_NODE_ENTRIES,
                         help=f"most (pod, node) pairs held by reservations, which bounds their memory "
                              f"(env MAX_RESERVED_NODES; default {MAX_NODE_ENTRIES})")
    srv.add_env_argument("--scheduler-name", env="SCHEDULER_NAME", default="my-scheduler",
                         help="the scheduler calling this extender: only unbound pods naming it in spec.schedulerName "
                              "get reservations (env SCHEDULER_NAME; default my-scheduler)")
    srv.add_env_argument("--tls-cert-file", env="TLS_CERT_FILE", type=Path, default=None,
                         help="server certificate (PEM); with --tls-key-file and --tls-client-ca-file the extender "
                              "serves only mutual TLS (env TLS_CERT_FILE; default: plain HTTP)")
    srv.add_env_argument("--tls-key-file", env="TLS_KEY_FILE", type=Path, default=None,
                         help="the server certificate's private key (PEM; env TLS_KEY_FILE)")
    srv.add_env_argument("--tls-client-ca-file", env="TLS_CLIENT_CA_FILE", type=Path, default=None,
                         help="CA certificates (PEM) a client certificate must be signed by (env TLS_CLIENT_CA_FILE)")
    srv.add_argument("--kubeconfig", default=None, help="kubeconfig (default: KUBECONFIG, then in-cluster)")
    add_logging_flags(srv)
    exp = sub.add_parser("explain", help="say whether a pod fits a node and why (reads the Node and its pods)")
    exp.add_argument("--node", required=True, help="node name")
    exp.add_argument("--pod", required=True, type=Path, help="pod manifest (YAML or JSON; '-' for stdin)")
    exp.add_argument("--kubeconfig", default=None, help="kubeconfig (default: KUBECONFIG, then in-cluster)")
    add_logging_flags(exp, level="WARNING")
    return parser


def _count(text: str) -> int:
    try:
        value = int(text.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number of at least 1, got {text[:30]!r}") from None
    if not 1 <= value <= 10_000_000:
        raise argparse.ArgumentTypeError(f"expected a whole number from 1 to 10000000, got {value}")
    return value


def _tls(args: argparse.Namespace, registry: CollectorRegistry) -> FollowedTls | None:
    """The followed TLS files from the three flags (all or none; TlsConfigError names what is wrong)."""
    files = {"--tls-cert-file": args.tls_cert_file, "--tls-key-file": args.tls_key_file,
             "--tls-client-ca-file": args.tls_client_ca_file}
    given = [flag for flag, value in files.items() if value is not None]
    if not given:
        return None
    if len(given) != len(files):
        missing = ", ".join(flag for flag in files if flag not in given)
        raise TlsConfigError(f"{', '.join(given)} needs {missing} too (the extender serves mutual TLS or plain HTTP)")
    return FollowedTls(args.tls_cert_file, args.tls_key_file, args.tls_client_ca_file, registry)


def _client(kubeconfig: str | None) -> AsyncClient:
    return AsyncClient(load_kubeconfig(kubeconfig), field_manager=PROG)


def _serve(args: argparse.Namespace) -> int:
    setup_logging(args.log_level, args.log_format)
    registry = CollectorRegistry()
    try:
        tls = _tls(args, registry)
    except TlsConfigError as exc:
        print(f"{PROG}: {exc}", file=sys.stderr)
        return 2
    try:
        load_kubeconfig(args.kubeconfig)
    except KubeconfigError as exc:  # a file is named but it is no kubeconfig: a setting to fix
        print(f"{PROG} serve: error: {exc}", file=sys.stderr)
        return 2
    except (ConfigError, OSError, ValueError):
        pass  # none at all: serve logs it and runs without counting bound pods
    metrics = serve_metrics(registry, args.metrics_port, args.metrics_address)

    async def main(stop: asyncio.Event) -> None:
        client: AsyncClient | None
        try:
            client = _client(args.kubeconfig)
        except (ConfigError, OSError, ValueError) as exc:
            log.error("no usable API server configuration; bound pods are not counted and nothing is reserved",
                      extra=kv(error=exc))
            client = None
        decider = Decider(reserve_for=args.reserve_for, max_reservations=args.max_reservations,
                          max_reserved_nodes=args.max_reserved_nodes,
                          max_reservations_per_namespace=args.max_reservations_per_namespace)
        service = ExtenderService(decider, registry, client, scheduler_name=args.scheduler_name)
        try:
            await serve(service, args.address, args.port, stop, tls)
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
            verdict = decider.verdict(pod, args.node, annotations.get(USAGE_ANNOTATION),
                                      away=device_plugin_away(node.to_dict()))
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
