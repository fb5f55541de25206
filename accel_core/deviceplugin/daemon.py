"""A device plugin's ``serve``, the twin of :class:`accel_core.dra.daemon.DraService`: the host scanner drives one
or more device-plugin servers.

A device plugin is a declaration, :class:`DevicePluginDaemon` (its name, its ``(resource, socket)`` registrations,
its coexistence rule, a cheap presence probe and how to load the rest), plus what that load gives: a
:class:`DevicePluginProfile` (the accelerator's host scanner, one policy per registration, and ``update``, which
takes each scan). :class:`DevicePluginService` does the rest, the same for every accelerator:

- serve and register first (:func:`~accel_core.deviceplugin.pluginserver.register_first`): this module loads only
  what that needs, and the profile, metrics and watchers load once the kubelet has the registration; the probe is
  asked only while the coexistence rule lets the plugin advertise;
- scan the host in a worker thread (never on the event loop) and hand the :class:`~accel_core.hostscan.HostScan`
  to the profile, whose policies take health from it and nowhere else;
- the :class:`~accel_core.deviceplugin.handover.DraHandover` (the device plugin's side of the coexistence rule);
- metrics (``/metrics`` and ``/readyz``);
- one host watcher (udev on a real host only: :func:`accel_core.hostscan.udev_subsystems` decides) with the health
  poll between rescans: on every change the host is scanned again, then every server re-reads its policy's list and
  streams it if it changed. Between rescans a fast poll (an event-loop timer,
  :class:`~accel_core.healthpoll.PollTimer`) re-reads only the few files that carry health and raise no change event
  on real sysfs (the scanner's ``health_files``); a difference counts as a host change. Each pass also re-reads the
  coexistence rule and what DRA claims hold, and the watcher is woken when the rule may change with no file event (a
  lease ends).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from accel_core.coexistence import Coexistence
from accel_core.deviceplugin.pluginserver import DevicePluginServer, register_first
from accel_core.deviceplugin.policy import DevicePluginProfile
from accel_core.hostscan import HostScan, udev_subsystems
from accel_core.logs import kv
from accel_core.paths import HostPaths

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry

    from accel_core.deviceplugin.handover import DraHandover
    from accel_core.nodeevents import LazyClient

log = logging.getLogger(__name__)

@dataclass(frozen=True)
class DevicePluginDaemon:
    """A device plugin, declared: what registers before the scan loads, and how to load the rest."""

    name: str
    """The console script (logs, the Events' source, the API client's name)."""
    registrations: tuple[tuple[str, str], ...]
    """``(resource, socket)``, in registration order."""
    coexistence: Coexistence
    load: Callable[[DevicePluginService], DevicePluginProfile[Any]]
    """Called once the kubelet has the registration: imports and builds the profile (it may register metrics on
    ``service.registry``, cleanups with ``service.on_close`` and use ``service.client``)."""
    probe: Callable[[HostPaths], bool] | None = None
    """A cheap look at whether devices are there: register before the first scan (None: only after it)."""


class DevicePluginService:
    """One node's device plugin for ``daemon`` (see the module docstring)."""

    def __init__(self, daemon: DevicePluginDaemon, paths: HostPaths, *, rescan_interval: float = 60.0,
                 health_poll_interval: float = 0.75, metrics_port: int = 0, metrics_address: str = "127.0.0.1",
                 node_name: str | None = None, kubeconfig: str | None = None, retry_interval: float = 1.0,
                 registry: CollectorRegistry | None = None) -> None:
        self.daemon = daemon
        self.paths = paths
        self.rescan_interval = rescan_interval
        self.health_poll_interval = health_poll_interval
        self.metrics_port = metrics_port
        self.metrics_address = metrics_address
        self.node_name = node_name
        self.kubeconfig = kubeconfig
        self._registry = registry
        self.servers = [DevicePluginServer(None, paths, resource_name=resource, socket_name=socket,
                                           expect_devices=self._expected, retry_interval=retry_interval)
                        for resource, socket in daemon.registrations]
        self.profile: DevicePluginProfile[Any] | None = None
        self.scan: HostScan[Any] | None = None
        self.handover: DraHandover | None = None
        self.client: LazyClient | None = None  #: the API client (Events, Node objects), once loaded
        self._closing: list[Callable[[], object]] = []

    @classmethod
    def from_args(cls, daemon: DevicePluginDaemon, paths: HostPaths, args: argparse.Namespace,
                  **kwargs: Any) -> DevicePluginService:
        """From :class:`~accel_core.deviceplugin.cli.DevicePluginCli`'s ``serve`` flags (``--node-name`` and
        ``--kubeconfig`` where the plugin declares them)."""
        return cls(daemon, paths, rescan_interval=args.rescan_interval,
                   health_poll_interval=args.health_poll_interval, metrics_port=args.metrics_port,
                   metrics_address=args.metrics_address, node_name=getattr(args, "node_name", None),
                   kubeconfig=getattr(args, "kubeconfig", None), **kwargs)

    @property
    def registry(self) -> CollectorRegistry:
        """The metrics registry (prometheus_client loads on first use, after the registration)."""
        if self._registry is None:
            from prometheus_client import CollectorRegistry

            self._registry = CollectorRegistry()
        return self._registry

    @property
    def inventory(self) -> Any:
        """The latest scan's inventory."""
        assert self.scan is not None, "read before the first scan"
        return self.scan.inventory

    def on_close(self, close: Callable[[], object]) -> None:
        """Call ``close`` when the service stops (after the servers)."""
        self._closing.append(close)

    def _expected(self) -> bool:
        probe = self.daemon.probe
        return (probe is not None and self.daemon.coexistence.device_plugin_blocked(self.paths) is None
                and probe(self.paths))

    def watch_paths(self) -> list[Path]:
        """The scanner's paths and the DRA driver's side of the coexistence rule."""
        scanner = self._profile.scanner
        return [*scanner.watch_paths(self.paths, self.inventory),
                *self.daemon.coexistence.device_plugin_watch_paths(self.paths)]

    @property
    def _profile(self) -> DevicePluginProfile[Any]:
        assert self.profile is not None, "used before the profile loaded"
        return self.profile

    def look(self) -> tuple[HostScan[Any], list[Path]]:
        """A scan and the health files it names (blocking: the service calls it in a worker thread)."""
        scanner = self._profile.scanner
        scan = scanner.scan(self.paths)
        return scan, scanner.health_files(self.paths, scan.inventory)

    async def rescan(self) -> list[Path]:
        """Scan off the event loop, then hand the scan to the profile; returns the health files to poll."""
        scan, files = await asyncio.to_thread(self.look)
        self._profile.update(scan)
        self.scan = scan
        return files

    # -- life cycle ----------------------------------------------------------------------------------------------
    async def run(self, stop: asyncio.Event) -> None:
        """Register, load, scan, advertise, follow the host until ``stop``."""
        daemon = self.daemon
        log.info("starting", extra=kv(daemon=daemon.name, resources=",".join(r for r, _ in daemon.registrations),
                                      rescan_interval=self.rescan_interval,
                                      health_poll_interval=self.health_poll_interval, **self.paths.describe()))
        await register_first(self.servers, stop)
        try:
            await self._serve(stop)
        finally:  # whatever failed, the servers stop (and remove their sockets) before the caller's loop ends
            stop.set()
            await asyncio.gather(*(s.start(stop) for s in self.servers), return_exceptions=True)

    async def _serve(self, stop: asyncio.Event) -> None:
        # the kubelet knows us (or there is nothing to register yet): load the rest now
        from accel_core.deviceplugin.handover import DraHandover
        from accel_core.metrics import serve_metrics
        from accel_core.nodeevents import LazyClient, NodeEvents

        daemon = self.daemon
        self.client = client = LazyClient(self.kubeconfig, daemon.name)  # the API loads on first use
        self.handover = handover = DraHandover(
            daemon.coexistence, self.paths, lambda: self._profile.scanner.device_plugin_ids(self.inventory),
            events=NodeEvents(client, self.node_name, daemon.name))
        http = None
        tasks: Sequence[asyncio.Task[None]] = ()
        try:
            self.profile = daemon.load(self)
            files = await self.rescan()  # off the loop: the kubelet may be calling us already
            http = serve_metrics(self.registry, self.metrics_port, self.metrics_address,
                                 not_ready=handover.not_ready)
            tasks = await self.profile.start(stop)
            await handover.refresh()  # whether the DRA driver serves this node, and what its claims hold
            for server, policy in zip(self.servers, self.profile.policies, strict=True):
                server.held = handover.held
                await server.attach(policy, self.registry)
            await self._watch(stop, files)
        finally:
            stop.set()
            # a task that died was logged when it did (logged_task); its error must not hide this shutdown
            await asyncio.gather(*tasks, return_exceptions=True)
            for close in self._closing:
                close()
            await handover.aclose()
            if handover.events is not None:
                await handover.events.drain()
            await client.aclose()
            if http is not None:
                http.shutdown()

    async def _watch(self, stop: asyncio.Event, files: list[Path]) -> None:
        """Follow the host until ``stop`` (or a server fails: its error is raised)."""
        from accel_core.healthpoll import FilePoller
        from accel_core.watch import watching_host

        handover = self.handover
        assert handover is not None
        tasks = [s.start(stop) for s in self.servers]  # already running (register_first)
        poller = FilePoller()
        poller.watch(files)
        recheck: asyncio.TimerHandle | None = None
        async with watching_host(self.watch_paths, poller, rescan_interval=self.rescan_interval,
                                 health_poll_interval=self.health_poll_interval,
                                 udev_subsystems=udev_subsystems(self._profile.scanner, self.paths)) as watcher:
            try:
                async for reason in watcher.changes(stop, tasks=tasks):
                    try:
                        files = await self.rescan()
                    except Exception:
                        log.exception("host rescan failed; keeping the previous device list",
                                      extra=kv(reason=reason))
                        continue
                    poller.watch(files)
                    await handover.refresh()
                    if recheck is not None:
                        recheck.cancel()
                    delay = handover.recheck_in()
                    recheck = (asyncio.get_running_loop().call_later(delay, watcher.kick, "coexistence")
                               if delay is not None else None)
                    for server in self.servers:
                        await server.refresh()
                for task in tasks:
                    if task.done() and not task.cancelled() and task.exception() is not None:
                        raise task.exception()  # type: ignore[misc]
            finally:
                if recheck is not None:
                    recheck.cancel()
                stop.set()
                for task in tasks:
                    with contextlib.suppress(asyncio.CancelledError):
                        await task


Serve = Callable[[HostPaths, argparse.Namespace], Callable[[asyncio.Event], Awaitable[None]]]


def serving(daemon: DevicePluginDaemon) -> Serve:
    """``DevicePluginCli.serve`` for a daemon whose flags are the common ones (plus ``--node-name`` and
    ``--kubeconfig`` where declared)."""
    return lambda paths, args: DevicePluginService.from_args(daemon, paths, args).run
