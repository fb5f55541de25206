"""The command line every DRA driver shares: ``serve``, ``slices``, ``webhook`` and ``remove-slices``.

- ``serve``: run the driver (kubelet sockets, ResourceSlices, health, liveness probe, metrics);
- ``slices``: print the ResourceSlice objects ``serve`` would publish for a host tree, without an API server;
- ``webhook``: serve the validating admission webhook that refuses a claim or claim template whose opaque config
  for this driver does not decode (:mod:`accel_core.dra.admission`);
- ``remove-slices``: delete this driver's ResourceSlices for a node (for uninstall and tests).

Environment (the upstream charts' names): NODE_NAME, POD_UID, CDI_ROOT, KUBELET_REGISTRAR_DIRECTORY_PATH,
KUBELET_PLUGINS_DIRECTORY_PATH, HEALTHCHECK_PORT, METRICS_PORT, KUBECONFIG (else the in-cluster config); and, as
the Neuron device plugin names them, RESCAN_INTERVAL and HEALTH_POLL_INTERVAL.
A driver's console script is ``main`` with its profile, program name and metrics port (see :class:`DriverCli`).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx2
import yaml
from lightkube import AsyncClient
from lightkube.config.client_adapter import verify_cluster
from lightkube.config.kubeconfig import SingleConfig
from lightkube.core.exceptions import ConfigError
from prometheus_client import CollectorRegistry

from accel_core.cli import (
    EnvArgumentParser,
    EnvFlag,
    add_common_flags,
    add_logging_flags,
    choice,
    ip_address,
    node_name,
    not_a_directory,
    object_name,
    port,
    port_or_disabled,
    safe_stdout,
    seconds,
    seconds_or_zero,
    setup_from_args,
    uid,
)
from accel_core.daemon import catch_stop_signals, run_daemon
from accel_core.dra import explain_args
from accel_core.dra.claimget import PROXY_ENV
from accel_core.dra.claims import ClaimGet, claim_get_for
from accel_core.dra.cleanup import DEFAULT_CLEANUP_INTERVAL
from accel_core.dra.daemon import (
    DEFAULT_HEALTH_POLL_INTERVAL,
    DEFAULT_HEALTHCHECK_PORT,
    DEFAULT_MIN_SLICE_WRITE_INTERVAL,
    DEFAULT_RESCAN_INTERVAL,
    DraService,
    ServiceSettings,
    dra_driver_version,
)
from accel_core.dra.profile import UNHEALTHY_TAINT_EFFECTS, DraProfile, tainted
from accel_core.dra.publisher import SlicePublisher, build_slices
from accel_core.dra.sockets import instance_lock_path
from accel_core.dra.taints import DEFAULT_NOEXECUTE_AFTER
from accel_core.instancelock import InstanceConflict, InstanceLock
from accel_core.kubeconfig import KubeconfigError, load_kubeconfig
from accel_core.kubeconfig import setting as kubeconfig_setting
from accel_core.logs import kv, setup_logging
from accel_core.metrics import serve_metrics
from accel_core.paths import (
    ENV_CDI_ROOT,
    ENV_KUBELET_ROOT,
    ENV_NODE_NAME,
    ENV_PLUGINS_DIR,
    ENV_POD_UID,
    ENV_REGISTRAR_DIR,
    HostPaths,
    add_path_flags,
    resolve_paths,
)

log = logging.getLogger(__name__)

#: The webhook's HTTPS port in the pod (the chart's Service maps 443 to it).
WEBHOOK_PORT = 8443


@dataclass(frozen=True)
class DriverCli:
    """What differs between two DRA drivers' command lines."""

    prog: str  #: ``neuron-dra-driver``
    description: str
    metrics_port: int
    profile: Callable[..., DraProfile[Any, Any]]
    """Makes the profile; called with each of ``flags`` as a keyword argument (by its ``dest``)."""
    flags: tuple[EnvFlag, ...] = ()
    """The driver's own flags (``serve`` and ``slices``), such as the flags its device plugin takes too."""
    healthcheck_port: int = DEFAULT_HEALTHCHECK_PORT
    """The liveness port's default: each driver's own (its registry declaration), so two drivers on a node
    never collide without a chart."""
    explain_hints: Callable[[], Any] | None = None
    """Gives ``explain``'s driver-specific lines (:class:`accel_core.dra.explain.ExplainHints`), e.g. connected
    sizes; called only when ``explain`` runs, so the explainer loads with it."""

    def make_profile(self, args: argparse.Namespace) -> DraProfile[Any, Any]:
        return self.profile(**{f.dest: getattr(args, f.dest, f.default) for f in self.flags})

    def parser(self) -> EnvArgumentParser:
        parser = EnvArgumentParser(prog=self.prog, description=self.description)
        sub = parser.add_subparsers(dest="command", required=True)

        serve = sub.add_parser("serve", help="run the DRA driver")
        add_common_flags(serve, metrics_port=self.metrics_port)
        _node_flag(serve)
        serve.add_env_argument("--pod-uid", env=ENV_POD_UID, type=uid, default=None,
                               help="this pod's UID, for per-pod socket names during rolling updates (env POD_UID)")
        serve.add_env_argument("--daemonset-name", env="DAEMONSET_NAME", type=object_name, default=None,
                               help="the DaemonSet this pod belongs to (env DAEMONSET_NAME, with POD_NAMESPACE): "
                                    "asked at shutdown whether the driver leaves the node for good (DaemonSet gone "
                                    "or no longer selecting the node), so the device plugin may serve it at once")
        serve.add_env_argument("--pod-namespace", env="POD_NAMESPACE", type=object_name, default=None,
                               help="this pod's namespace (env POD_NAMESPACE)")
        serve.add_env_argument("--healthcheck-port", env="HEALTHCHECK_PORT", type=port_or_disabled,
                               default=self.healthcheck_port,
                               help=f"gRPC liveness port (env HEALTHCHECK_PORT; default {self.healthcheck_port}; "
                                    "-1 off, 0 picks one)")
        serve.add_argument("--kubeconfig", default=None,
                           help="kubeconfig file (default: KUBECONFIG, then in-cluster)")
        serve.add_env_argument("--rescan-interval", env="RESCAN_INTERVAL", type=seconds,
                               default=DEFAULT_RESCAN_INTERVAL,
                               help="seconds between full host rescans besides those inotify/udev events and the "
                                    "health poll start: a safety net (env RESCAN_INTERVAL; default "
                                    f"{DEFAULT_RESCAN_INTERVAL:g})")
        serve.add_env_argument("--health-poll-interval", env="HEALTH_POLL_INTERVAL", type=seconds,
                               default=DEFAULT_HEALTH_POLL_INTERVAL,
                               help="seconds between reads of the few health files that raise no event on sysfs: "
                                    "port state, error counters (env HEALTH_POLL_INTERVAL; default "
                                    f"{DEFAULT_HEALTH_POLL_INTERVAL:g})")
        serve.add_env_argument("--registration-wait", env="REGISTRATION_WAIT", type=_non_negative, default=0.0,
                               help="publish the ResourceSlices only once the kubelet has registered the plugin, "
                                    "waiting at most this many seconds (env REGISTRATION_WAIT; default 0: at once; "
                                    "the charts set 30)")
        serve.add_argument("--cleanup-interval", type=_non_negative, default=DEFAULT_CLEANUP_INTERVAL,
                           help="seconds between cleanups of stale prepared claims (also run at start); "
                                "default 600, 0 disables")
        serve.add_env_argument("--device-status", env="DEVICE_STATUS", type=choice("on", "off"), default="on",
                               help="write status.devices of the claims this driver prepares, after answering the "
                                    "kubelet (env DEVICE_STATUS; on or off; default on)")
        serve.add_env_argument("--device-metadata", env="DEVICE_METADATA", type=choice("on", "off"), default="on",
                               help="write each prepared request's device metadata file (KEP-5304) and mount it "
                                    "read-only in its containers under /var/run/kubernetes.io/dra-device-attributes "
                                    "(env DEVICE_METADATA; on or off; default on)")
        serve.add_env_argument("--unhealthy-taint-effect", env="UNHEALTHY_TAINT_EFFECT",
                               type=choice(*UNHEALTHY_TAINT_EFFECTS), default="NoSchedule",
                               help="effect of the <driver>/unhealthy taint on an unhealthy device: NoSchedule keeps "
                                    "new claims off it, NoExecute also evicts the pods using it "
                                    "(env UNHEALTHY_TAINT_EFFECT; default NoSchedule)")
        serve.add_env_argument("--noexecute-after", env="UNHEALTHY_NOEXECUTE_AFTER", type=_non_negative,
                               default=DEFAULT_NOEXECUTE_AFTER,
                               help="with --unhealthy-taint-effect NoExecute: seconds a device must stay unhealthy "
                                    "before its taint turns NoExecute (NoSchedule until then, at once), so a blip "
                                    "or a flapping port evicts nothing (env UNHEALTHY_NOEXECUTE_AFTER; default "
                                    f"{DEFAULT_NOEXECUTE_AFTER:g}; 0: at once)")
        serve.add_env_argument("--min-slice-write-interval", env="MIN_SLICE_WRITE_INTERVAL", type=_non_negative,
                               default=DEFAULT_MIN_SLICE_WRITE_INTERVAL,
                               help="seconds between ResourceSlice writes that keep the same devices (health: "
                                    "taints, port state); the latest state goes out then (env "
                                    f"MIN_SLICE_WRITE_INTERVAL; default {DEFAULT_MIN_SLICE_WRITE_INTERVAL:g}; 0: no "
                                    "limit)")
        serve.add_argument("--remove-slices-on-exit", action="store_true",
                           help="delete this driver's ResourceSlices when stopping (uninstall); off for upgrades")
        for flag in self.flags:
            flag.add_to(serve)

        slices = sub.add_parser("slices", help="print the ResourceSlices serve would publish (no API server)")
        add_path_flags(slices)
        _node_flag(slices)
        slices.add_argument("--node-uid", default=None,
                            help="the Node's UID, to include the owner reference serve adds (looked up by serve)")
        slices.add_argument("--output", "-o", choices=["json", "yaml"], default="json")
        for flag in self.flags:
            flag.add_to(slices)

        handoff = sub.add_parser("handoff", help="delete the driver's DaemonSet in the foreground and wait (the "
                                 "charts' pre-delete hook: each driver leaves its node with its RBAC intact)")
        handoff.add_argument("--namespace", required=True, type=object_name)
        handoff.add_argument("--daemonset", required=True, type=object_name)
        handoff.add_argument("--timeout", type=seconds, default=120.0)
        handoff.add_argument("--kubeconfig", default=None)
        add_logging_flags(handoff)

        hook = sub.add_parser("webhook", help="serve the validating admission webhook that checks this driver's "
                                             "opaque configs in ResourceClaims and ResourceClaimTemplates (HTTPS)")
        hook.add_env_argument("--port", env="WEBHOOK_PORT", type=port, default=WEBHOOK_PORT,
                              help=f"HTTPS port (env WEBHOOK_PORT; default {WEBHOOK_PORT})")
        hook.add_env_argument("--address", env="WEBHOOK_ADDRESS", type=ip_address, default="0.0.0.0",
                              help="address to listen on (env WEBHOOK_ADDRESS; default all)")
        hook.add_env_argument("--tls-cert-file", env="TLS_CERT_FILE", type=_existing_file, default=None,
                              help="server certificate (PEM) the API server checks against the webhook's caBundle "
                                   "(env TLS_CERT_FILE; required)")
        hook.add_env_argument("--tls-key-file", env="TLS_KEY_FILE", type=_existing_file, default=None,
                              help="the certificate's private key (PEM; env TLS_KEY_FILE; required)")
        add_logging_flags(hook)
        for flag in self.flags:
            flag.add_to(hook)

        remove = sub.add_parser("remove-slices", help="delete this driver's ResourceSlices for a node")
        _node_flag(remove)
        remove.add_argument("--kubeconfig", default=None)
        add_logging_flags(remove)

        explain_args.add_arguments(sub.add_parser(
            "explain", help="say node by node why a pod's claims, a claim or a template cannot be allocated "
                            "(read-only; or which devices would be chosen)"))
        return parser

    def main(self, argv: Sequence[str] | None = None) -> int:
        args = self.parser().parse_args(argv)
        if args.command == "explain":
            from accel_core.dra import explain_report

            return explain_report.run(args, self.prog, self.explain_hints() if self.explain_hints else None)
        if args.command == "webhook":
            return self._webhook(args)
        if args.command == "handoff":
            from accel_core.dra.handoff import handoff

            setup_logging(args.log_level, args.log_format)
            return handoff(args.namespace, args.daemonset, timeout=args.timeout, kubeconfig=args.kubeconfig)
        if not args.node_name:
            print(f"{self.prog}: --node-name (or env NODE_NAME) is required", file=sys.stderr)
            return 2
        if args.command == "slices":
            return self._slices(args)
        if args.command == "remove-slices":
            try:
                return self._remove(args)
            except KubeconfigError as exc:
                print(f"{self.prog} remove-slices: error: {exc}", file=sys.stderr)
                return 2
            except ConfigError as exc:
                print(f"{self.prog}: {exc}", file=sys.stderr)
                return 1
        return self._serve(args)

    def _slices(self, args: argparse.Namespace) -> int:
        safe_stdout()
        profile = self.make_profile(args)
        scan = profile.scan(resolve_paths(args), dra_driver_version())
        devices = tainted(profile.driver_name, scan.devices, scan.health)
        slices = build_slices(profile.driver_name, args.node_name, devices, node_uid=args.node_uid,
                              counters=scan.counters)
        objects = [dict(sorted(s.to_dict().items())) for s in slices]  # apiVersion, kind, metadata, spec
        if args.output == "yaml":
            sys.stdout.write(yaml.safe_dump(objects, sort_keys=False))
        else:
            sys.stdout.write(json.dumps(objects, indent=2) + "\n")
        return 0

    def _serve(self, args: argparse.Namespace) -> int:
        catch_stop_signals()
        paths = setup_from_args(args, daemon=self.prog)
        for noisy in ("httpx2", "httpx", "httpcore"):  # one line per API request is too much at INFO
            logging.getLogger(noisy).setLevel(max(logging.WARNING, logging.getLogger().level))
        bad_dir = not_a_directory(directory_settings(paths))
        config: SingleConfig | None = None
        try:
            config = kube_config(args.kubeconfig)
        except KubeconfigError as exc:  # a file is named but it is no kubeconfig: a setting to fix
            bad_dir = bad_dir or str(exc)
        except (ConfigError, OSError, ValueError) as exc:
            log.error("no usable API server configuration", extra=kv(error=exc))
        if bad_dir is not None:
            print(f"{self.prog} serve: error: {bad_dir}", file=sys.stderr)
            return 2
        registry = CollectorRegistry()
        serve_metrics(registry, args.metrics_port, args.metrics_address)
        profile = self.make_profile(args)
        log.info("starting DRA driver", extra=kv(driver=profile.driver_name, node=args.node_name,
                                                 version=dra_driver_version(), **paths.describe()))
        instance = InstanceLock(instance_lock_path(paths, profile.driver_name, args.pod_uid))
        try:
            instance.acquire()  # before anything is read or written; held until the process ends
        except (InstanceConflict, OSError) as exc:
            log.error("refusing to start: another instance serves these sockets" if isinstance(
                exc, InstanceConflict) else "cannot take the instance lock", extra=kv(driver=profile.driver_name,
                                                                                        error=exc))
            return 2

        settings = ServiceSettings(
            node_name=args.node_name, pod_uid=args.pod_uid, healthcheck_port=args.healthcheck_port,
            rescan_interval=args.rescan_interval, health_poll_interval=args.health_poll_interval,
            cleanup_interval=args.cleanup_interval, remove_slices_on_exit=args.remove_slices_on_exit,
            device_status=args.device_status == "on", device_metadata=args.device_metadata == "on",
            taint_effect=args.unhealthy_taint_effect,
            noexecute_after=args.noexecute_after, min_slice_write_interval=args.min_slice_write_interval,
            registration_wait=args.registration_wait,
            daemonset=(args.pod_namespace, args.daemonset_name) if args.pod_namespace and args.daemonset_name else None)

        async def main(stop: asyncio.Event) -> None:
            client: AsyncClient | None = None
            claims: ClaimGet | None = None
            if config is not None:
                try:
                    client = kube_client(config, self.prog)
                    claims = claim_get_for(config, keepalive=API_KEEPALIVE_SECONDS, field_manager=self.prog)
                except (ConfigError, OSError, ValueError) as exc:
                    log.error("no usable API server configuration", extra=kv(error=exc))
                    client = None
            service = DraService(profile, paths, settings, client=client, claims=claims, registry=registry,
                                 instance_lock=instance)
            try:
                await service.run(stop)
            finally:
                if client is not None:
                    await client.close()
                if claims is not None:
                    claims.close()

        return run_daemon(main, self.prog, serves_grpc=True)

    def _webhook(self, args: argparse.Namespace) -> int:
        # aiohttp (0.12 s of imports) loads for this command only, not at every driver start
        from accel_core.dra.webhookserver import TlsFileError, WebhookServer
        from accel_core.dra.webhookserver import server_context as webhook_tls

        setup_logging(args.log_level, args.log_format)
        missing = [flag for flag, value in (("--tls-cert-file", args.tls_cert_file),
                                            ("--tls-key-file", args.tls_key_file)) if value is None]
        if missing:
            print(f"{self.prog} webhook: error: {' and '.join(missing)} required: the API server calls admission "
                  "webhooks over HTTPS only", file=sys.stderr)
            return 2
        try:
            context = webhook_tls(args.tls_cert_file, args.tls_key_file)
        except TlsFileError as exc:
            print(f"{self.prog} webhook: error: {exc}", file=sys.stderr)
            return 2
        profile = self.make_profile(args)
        server = WebhookServer(profile.driver_name, profile.decode_config, args.address, args.port, context)
        return run_daemon(server.run, self.prog)

    def _remove(self, args: argparse.Namespace) -> int:
        setup_logging(args.log_level, args.log_format)
        driver = self.make_profile(args).driver_name

        async def main() -> int:
            client = kube_client(kube_config(args.kubeconfig), self.prog)
            try:
                removed = await SlicePublisher(client, driver, args.node_name).remove_all()
            finally:
                await client.close()
            print(f"removed {removed} ResourceSlice(s) of {driver} on node {args.node_name}")
            return 0

        return asyncio.run(main())


def _non_negative(text: str) -> float:
    if text.strip().startswith("-"):
        raise argparse.ArgumentTypeError(f"must be 0 (off) or more seconds, not {text}")
    return seconds_or_zero(text)


def _existing_file(text: str) -> Path:
    if not os.path.isfile(text):
        raise argparse.ArgumentTypeError(f"expected a PEM file, got {text[:200]!r} (no such file)")
    return Path(text)


def _node_flag(parser: EnvArgumentParser) -> None:
    parser.add_env_argument("--node-name", env=ENV_NODE_NAME, type=node_name, default=None,
                            help="this node's name: the pool name (env NODE_NAME)")


#: Seconds an idle API server connection is kept (the HTTP client's default is 5 s). Prepares come minutes apart,
#: so with the default nearly every claim read paid a new TCP and TLS handshake (3-6 ms became 7-21 ms here).
#: Below the API server's own 90 s idle timeout, so it is never the server that drops a connection we reuse.
API_KEEPALIVE_SECONDS = 60.0


def kube_config(kubeconfig: str | None) -> SingleConfig:
    """The current context of ``kubeconfig`` (else KUBECONFIG, ~/.kube/config or in-cluster); KubeconfigError for
    a file that is no kubeconfig."""
    loaded = load_kubeconfig(kubeconfig)
    try:
        config = loaded.get()
    except ConfigError:
        raise
    except Exception:  # a document with the keys but not their shapes
        raise KubeconfigError(f"{kubeconfig_setting(kubeconfig)}: not a usable kubeconfig (malformed context)") \
            from None
    if config is None or config.user is None:
        raise ConfigError("the kubeconfig has no current context with a cluster and a user")
    return config


def directory_settings(paths: HostPaths) -> list[tuple[str, Path]]:
    """The directories serve makes or writes in, each with the setting that names it."""
    out = [(f"--cdi-root (env {ENV_CDI_ROOT})", paths.cdi_root)]
    if paths.registrar_dir is None or paths.plugins_dir is None:  # one of them lives under the kubelet root
        out.append((f"--kubelet-root (env {ENV_KUBELET_ROOT})", paths.kubelet_root))
    if paths.registrar_dir is not None:
        out.append((f"--registrar-dir (env {ENV_REGISTRAR_DIR})", paths.registrar_dir))
    if paths.plugins_dir is not None:
        out.append((f"--plugins-dir (env {ENV_PLUGINS_DIR})", paths.plugins_dir))
    return out


def kube_client(config: SingleConfig, field_manager: str) -> AsyncClient:
    """lightkube's client for ``config``, with connections kept API_KEEPALIVE_SECONDS."""
    if any(os.environ.get(name) for name in PROXY_ENV) or config.user is None:
        return AsyncClient(config, field_manager=field_manager)
    # the transport lightkube would build, but with our keep-alive (TLS as lightkube sets it up from the config)
    transport = httpx2.AsyncHTTPTransport(
        verify=verify_cluster(config.cluster, config.user, config.abs_file),
        limits=httpx2.Limits(max_connections=100, max_keepalive_connections=20,
                             keepalive_expiry=API_KEEPALIVE_SECONDS))
    return AsyncClient(config, field_manager=field_manager, transport=transport)
