"""``neuron-dra-driver``: the Neuron DRA kubelet plugin for ``neuron.aws.com``.

Subcommands:

- ``serve``: run the driver (kubelet sockets, ResourceSlices, health, liveness probe, metrics on 9812);
- ``slices``: print the ResourceSlice objects ``serve`` would publish for a host tree, without an API server;
- ``remove-slices``: delete this driver's ResourceSlices for a node (for uninstall and tests).

Environment (the chart's names): NODE_NAME, POD_UID, CDI_ROOT, KUBELET_REGISTRAR_DIRECTORY_PATH,
KUBELET_PLUGINS_DIRECTORY_PATH, HEALTHCHECK_PORT, METRICS_PORT, KUBECONFIG (else the in-cluster config).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import sys
from collections.abc import Sequence

import yaml
from lightkube import AsyncClient, KubeConfig
from lightkube.core.exceptions import ConfigError
from prometheus_client import CollectorRegistry

from accel_core.cli import (
    EnvArgumentParser,
    add_common_flags,
    add_logging_flags,
    node_name,
    port_or_disabled,
    safe_stdout,
    seconds,
    seconds_or_zero,
    setup_from_args,
    uid,
)
from accel_core.daemon import run_daemon
from accel_core.dra.slices import SlicePublisher, build_slices
from accel_core.logs import kv, setup_logging
from accel_core.metrics import serve_metrics
from accel_core.paths import ENV_NODE_NAME, ENV_POD_UID, add_path_flags, resolve_paths
from neuron_dra.discovery import discover
from neuron_dra.dra.attributes import DRIVER_NAME, slice_devices
from neuron_dra.dra.cleanup import DEFAULT_CLEANUP_INTERVAL
from neuron_dra.dra.health import assess
from neuron_dra.dra.service import DEFAULT_HEALTHCHECK_PORT, NeuronDraService, dra_driver_version

log = logging.getLogger("neuron_dra.dra")

METRICS_PORT = 9812
FIELD_MANAGER = "neuron-dra-driver"


def _parser() -> EnvArgumentParser:
    parser = EnvArgumentParser(prog="neuron-dra-driver", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)

    serve = sub.add_parser("serve", help="run the DRA driver")
    add_common_flags(serve, metrics_port=METRICS_PORT)
    _node_flag(serve)
    serve.add_env_argument("--pod-uid", env=ENV_POD_UID, type=uid, default=None,
                           help="this pod's UID, for per-pod socket names during rolling updates (env POD_UID)")
    serve.add_env_argument("--healthcheck-port", env="HEALTHCHECK_PORT", type=port_or_disabled,
                           default=DEFAULT_HEALTHCHECK_PORT,
                           help="gRPC liveness port (env HEALTHCHECK_PORT; default 51515; -1 disables, 0 picks one)")
    serve.add_argument("--kubeconfig", default=None, help="kubeconfig file (default: KUBECONFIG, then in-cluster)")
    serve.add_argument("--rescan-interval", type=seconds, default=10.0,
                       help="seconds between full host rescans (health counters, /dev nodes); default 10")
    serve.add_argument("--cleanup-interval", type=_non_negative, default=DEFAULT_CLEANUP_INTERVAL,
                       help="seconds between cleanups of stale prepared claims (also run at start); "
                            "default 600, 0 disables")
    serve.add_argument("--remove-slices-on-exit", action="store_true",
                       help="delete this driver's ResourceSlices when stopping (uninstall); off for upgrades")

    slices = sub.add_parser("slices", help="print the ResourceSlices serve would publish (no API server)")
    add_path_flags(slices)
    _node_flag(slices)
    slices.add_argument("--node-uid", default=None,
                        help="the Node's UID, to include the owner reference serve adds (looked up by serve)")
    slices.add_argument("--output", "-o", choices=["json", "yaml"], default="json")

    remove = sub.add_parser("remove-slices", help="delete this driver's ResourceSlices for a node")
    _node_flag(remove)
    remove.add_argument("--kubeconfig", default=None)
    add_logging_flags(remove)
    return parser


def _non_negative(text: str) -> float:
    if text.strip().startswith("-"):
        raise argparse.ArgumentTypeError(f"must be 0 (off) or more seconds, not {text}")
    return seconds_or_zero(text)


def _node_flag(parser: EnvArgumentParser) -> None:
    parser.add_env_argument("--node-name", env=ENV_NODE_NAME, type=node_name, default=None,
                            help="this node's name: the pool name (env NODE_NAME)")


def _kube_client(kubeconfig: str | None) -> AsyncClient:
    config = KubeConfig.from_file(kubeconfig) if kubeconfig else KubeConfig.from_env()
    return AsyncClient(config, field_manager=FIELD_MANAGER)


def _slices(args: argparse.Namespace) -> int:
    safe_stdout()
    paths = resolve_paths(args)
    inv = discover(paths)
    objects = build_slices(DRIVER_NAME, args.node_name, slice_devices(inv, dra_driver_version(), assess(inv)),
                           node_uid=args.node_uid)
    if args.output == "yaml":
        sys.stdout.write(yaml.safe_dump(objects, sort_keys=False))
    else:
        sys.stdout.write(json.dumps(objects, indent=2) + "\n")
    return 0


def _serve(args: argparse.Namespace) -> int:
    paths = setup_from_args(args)
    for noisy in ("httpx2", "httpx", "httpcore"):  # one line per API request is too much at INFO
        logging.getLogger(noisy).setLevel(max(logging.WARNING, logging.getLogger().level))
    registry = CollectorRegistry()
    serve_metrics(registry, args.metrics_port, args.metrics_address)
    log.info("starting Neuron DRA driver", extra=kv(driver=DRIVER_NAME, node=args.node_name,
                                                    version=dra_driver_version(), **paths.describe()))

    async def main(stop: asyncio.Event) -> None:
        client: AsyncClient | None
        try:
            client = _kube_client(args.kubeconfig)
        except (ConfigError, OSError, ValueError) as exc:
            log.error("no usable API server configuration", extra=kv(error=exc))
            client = None
        service = NeuronDraService(paths, node_name=args.node_name, client=client, pod_uid=args.pod_uid,
                                   healthcheck_port=args.healthcheck_port, rescan_interval=args.rescan_interval,
                                   cleanup_interval=args.cleanup_interval,
                                   remove_slices_on_exit=args.remove_slices_on_exit, registry=registry)
        try:
            await service.run(stop)
        finally:
            if client is not None:
                await client.close()

    return run_daemon(main, "neuron-dra-driver")


def _remove(args: argparse.Namespace) -> int:
    setup_logging(args.log_level, args.log_format)

    async def main() -> int:
        client = _kube_client(args.kubeconfig)
        try:
            removed = await SlicePublisher(client, DRIVER_NAME, args.node_name).remove_all()
        finally:
            await client.close()
        print(f"removed {removed} ResourceSlice(s) of {DRIVER_NAME} on node {args.node_name}")
        return 0

    return asyncio.run(main())


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if not args.node_name:
        print("neuron-dra-driver: --node-name (or env NODE_NAME) is required", file=sys.stderr)
        return 2
    if args.command == "slices":
        return _slices(args)
    if args.command == "remove-slices":
        try:
            return _remove(args)
        except ConfigError as exc:
            print(f"neuron-dra-driver: {exc}", file=sys.stderr)
            return 1
    return _serve(args)


if __name__ == "__main__":
    sys.exit(main())
