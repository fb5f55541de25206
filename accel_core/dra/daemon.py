"""A DRA driver's ``serve``: wires a profile, the handler, the kubelet plugin, the slice publisher, the liveness
probe, the stale-claim cleaner and the host watcher together on one event loop.

Host scans, the checkpoint load and CDI restores run in a worker thread; the event loop only waits for them.

Start-up order: scan the host, load the checkpoint, re-create lost or damaged CDI specs and remove orphan ones
(under the plugin's locks, so never in the middle of another pod's prepare), serve the DRA and registration
sockets, start the liveness service, hand the complete device list to the publisher. Afterwards every host
change re-scans: inotify on the scanner's watch paths, udev, the health poll, and a slow periodic rescan (the
safety net for anything else without an event). The health poll, as in the device plugins, re-reads only the
scanner's ``health_files`` (port state, error counters: no sysfs event when they change) every
``health_poll_interval`` seconds from an event-loop timer, one ``pread`` each, and kicks a rescan when one
changed. The publisher writes only if the published content changed, and the kubelet's health stream gets a new
full list when health changed and at least every ``health_refresh_seconds`` (20 s; each report carries a 60 s
timeout, after which the kubelet would treat the device's health as unknown). With an API server, stale
checkpoint entries are cleaned up once the sockets are served and then every ``cleanup_interval`` seconds (see
:mod:`accel_core.dra.cleanup`).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any, Protocol

from lightkube import AsyncClient
from prometheus_client import CollectorRegistry

from accel_core.dra.cdi import CdiSpecWriter
from accel_core.dra.checkpoint import read_boot_id
from accel_core.dra.claimreport import ClaimProblem
from accel_core.dra.claims import ClaimGet, ClaimReader, NoApiClaimGet
from accel_core.dra.cleanup import DEFAULT_CLEANUP_INTERVAL, StaleClaimCleaner
from accel_core.dra.handover import DevicePluginHolds, Presence, device_plugin_drained, read_node
from accel_core.dra.liveness import LivenessServer, check_own_sockets
from accel_core.dra.metadata import MetadataFiles
from accel_core.dra.metrics import DriverMetrics
from accel_core.dra.nodelabels import NODE_LABELS_WAIT_S, NodeLabelWatch, with_attributes
from accel_core.dra.pluginserver import DraPlugin
from accel_core.dra.preparation import CDI_CLASS, DraDriver, HealthBook, cdi_vendor
from accel_core.dra.prepared import PreparedClaim
from accel_core.dra.profile import DraProfile, Scan
from accel_core.dra.publisher import SlicePublisher
from accel_core.dra.reporter import ClaimReporter
from accel_core.dra.slicemodel import CounterSet, SliceDevice, SliceValidationError, Taint
from accel_core.dra.status import DeviceStatusWriter
from accel_core.dra.store import ClaimStore
from accel_core.dra.taints import DEFAULT_NOEXECUTE_AFTER, UnhealthyTaints
from accel_core.dra.types import ClaimError
from accel_core.health import HEALTHY, DeviceHealth
from accel_core.healthpoll import FilePoller
from accel_core.hostscan import udev_subsystems
from accel_core.instancelock import InstanceLock
from accel_core.logs import ProblemLog, kv
from accel_core.ownnode import OwnNode
from accel_core.paths import HostPaths
from accel_core.watch import STOP, ChangeWatcher, wake, watching_host

log = logging.getLogger(__name__)

DEFAULT_HEALTHCHECK_PORT = 51515
#: Seconds between full host rescans besides those events and the health poll start: a safety net. A rescan of a
#: trn2.48xlarge costs ~7 ms of CPU; every 10 s, rescans were half of an idle driver's CPU.
DEFAULT_RESCAN_INTERVAL = 60.0
#: Seconds between reads of the health files (the device plugins' pace; each poll wakes the daemon for ~0.2 ms):
#: a change reaches the kubelet within 1 s (poll, 50 ms debounce, rescan, health stream send).
DEFAULT_HEALTH_POLL_INTERVAL = 0.75
FALLBACK_VERSION = "0.1.0"
#: seconds between rescans while device-plugin pods hold some of the devices (their end raises no host event)
HELD_RECHECK_S = 5.0
#: how long the slices wait for the device plugin's resources to leave the Node's allocatable (the kubelet reports
#: them every nodeStatusUpdateFrequency, 10 s by default)
DRAIN_WAIT_S = 30.0
#: Seconds between slice writes that keep the same devices (health: taints, port state), the latest state then: a
#: flapping port costs at most 60 / this pool writes a minute (a taint appears at once when none went out that long
#: before).
DEFAULT_MIN_SLICE_WRITE_INTERVAL = 5.0


def dra_driver_version() -> str:
    """The package version (a semantic version), published as ``draDriverVersion``."""
    try:
        return metadata.version("aws-accel-agents")
    except metadata.PackageNotFoundError:
        return FALLBACK_VERSION


@dataclass(frozen=True)
class ServiceSettings:
    """How one node's driver runs (the ``serve`` flags)."""

    node_name: str
    pod_uid: str | None = None
    healthcheck_port: int = DEFAULT_HEALTHCHECK_PORT
    rescan_interval: float = DEFAULT_RESCAN_INTERVAL
    health_poll_interval: float = DEFAULT_HEALTH_POLL_INTERVAL
    health_refresh_seconds: float = 20.0
    cleanup_interval: float = DEFAULT_CLEANUP_INTERVAL
    remove_slices_on_exit: bool = False
    device_status: bool = True
    #: device metadata files (KEP-5304) bind-mounted into the containers of each prepared request
    device_metadata: bool = True
    taint_effect: str = "NoSchedule"
    noexecute_after: float = DEFAULT_NOEXECUTE_AFTER
    min_slice_write_interval: float = DEFAULT_MIN_SLICE_WRITE_INTERVAL
    registration_wait: float = 0.0
    #: (namespace, name) of the DaemonSet this pod belongs to, asked at shutdown whether the driver leaves for good
    daemonset: tuple[str, str] | None = None
    dra_version: str | None = None


class Publisher(Protocol):
    """Keeps this node's ResourceSlices as the devices handed to it (:class:`SlicePublisher`)."""

    def set_devices(self, devices: Sequence[SliceDevice], counters: Sequence[CounterSet] = ()) -> None: ...

    def know_node(self, node: Any) -> None: ...

    async def run(self, stop: asyncio.Event) -> None: ...

    async def remove_all(self) -> int: ...


@dataclass(frozen=True)
class ClaimNotices:
    """What the driver's prepares tell (:class:`~accel_core.dra.preparation.PrepareNotices`) goes to the claims'
    status writer and the problem reporter, each of which queues it for a task on the event loop."""

    status: DeviceStatusWriter | None
    reporter: ClaimReporter | None

    def prepared(self, claims: Sequence[PreparedClaim]) -> None:
        if self.status is not None:
            self.status.submit(claims)
        if self.reporter is not None:
            self.reporter.resolved([c.uid for c in claims])

    def failed(self, problems: Sequence[ClaimProblem]) -> None:
        if self.reporter is not None:
            self.reporter.submit(problems)


class DraService:
    """One node's DRA driver for ``profile``, built from its collaborators: ``client`` (lightkube's, for slices,
    Node, status and Events; None: serve the kubelet but publish nothing), ``claims`` (the blocking claim GET the
    plugin reads with, :func:`accel_core.dra.claims.claim_get_for`; None: none, so every prepare fails saying so),
    ``publisher`` (default: a :class:`SlicePublisher` on ``client``), ``registry`` and ``instance_lock`` (default: the
    plugin's own, taken by :meth:`run`)."""

    def __init__(
        self,
        profile: DraProfile[Any, Any],
        paths: HostPaths,
        settings: ServiceSettings,
        *,
        client: AsyncClient | None = None,
        claims: ClaimGet | None = None,
        publisher: Publisher | None = None,
        registry: CollectorRegistry | None = None,
        instance_lock: InstanceLock | None = None,
    ) -> None:
        node_name = settings.node_name
        self.profile = profile
        self.registration_wait = settings.registration_wait
        self.driver_name = profile.driver_name
        self.paths = paths
        self.node_name = node_name
        self.client = client
        self.rescan_interval = settings.rescan_interval
        self.health_poll_interval = settings.health_poll_interval
        self.health_refresh_seconds = settings.health_refresh_seconds
        self.cleanup_interval = settings.cleanup_interval
        self.remove_slices_on_exit = settings.remove_slices_on_exit
        self.taints = UnhealthyTaints(self.driver_name, settings.taint_effect,
                                      noexecute_after=settings.noexecute_after)
        self.dra_version = settings.dra_version or dra_driver_version()
        self.registry = registry if registry is not None else CollectorRegistry()
        self.metrics = DriverMetrics(self.registry, profile.metrics_prefix)
        self.scan: Scan[Any] = Scan(None, ())  # the first real scan is the first thing run() does
        self.cdi = CdiSpecWriter(paths.cdi_root, cdi_vendor(self.driver_name), CDI_CLASS)
        data_dir = paths.plugins_data_dir / self.driver_name
        self.store = ClaimStore(data_dir / "checkpoint.json", read_boot_id(paths.host_root))
        self.reader = ClaimReader(claims if claims is not None else NoApiClaimGet(), self.metrics)
        self.health = HealthBook()  #: each published device's health, as the driver last heard it
        self.status = (DeviceStatusWriter(client, self.driver_name, still_prepared=self.store.get,
                                          health=self.health.get, node=node_name)
                       if client is not None and settings.device_status else None)
        #: Failed prepares and health changes of prepared claims, on the claims and their pods (Events).
        self.reporter = (ClaimReporter(client, self.driver_name, node_name, prepared=self.store.get,
                                       health=self.health.get, write_status=settings.device_status)
                         if client is not None else None)
        self.driver = DraDriver(profile, node_name=node_name, cdi=self.cdi, store=self.store, metrics=self.metrics,
                                health=self.health, notices=ClaimNotices(self.status, self.reporter)
                                if client is not None else None,
                                metadata=MetadataFiles(self.driver_name, data_dir)
                                if settings.device_metadata else None)
        self.plugin = DraPlugin(self.driver, paths, claims=self.reader, pod_uid=settings.pod_uid,
                                registry=self.registry)
        if instance_lock is not None:
            self.plugin.instance = instance_lock
        self.cleaner = StaleClaimCleaner(store=self.store, reader=self.reader, unprepare=self.plugin.unprepare_claims,
                                         driver=self.driver_name, pool=node_name, metrics=self.metrics)
        self.publisher: Publisher | None = publisher if publisher is not None else (
            SlicePublisher(client, self.driver_name, node_name, registry=self.registry,
                           min_write_interval=settings.min_slice_write_interval, on_listed=self._seed_taints)
            if client is not None else None)
        self.own_node = OwnNode(client, node_name)
        self.node_labels: NodeLabelWatch | None = None  #: Node labels -> device attributes (once scanned)
        self.liveness = (LivenessServer(self.check_liveness, settings.healthcheck_port)
                         if settings.healthcheck_port >= 0 else None)
        self.ready = asyncio.Event()
        self.poller = FilePoller()  #: the profile's health files, re-watched after every scan
        self._last_push = 0.0  # loop time of the last full list sent to the health stream
        coexistence = profile.scanner.coexistence
        self.holds = DevicePluginHolds(coexistence, paths)  #: devices device-plugin pods still hold (not published)
        self.presence = Presence(coexistence, paths, node=node_name, pod_uid=settings.pod_uid, client=client,
                                 daemonset=settings.daemonset)
        self.held: frozenset[str] = frozenset()
        self._sharing_logged: str | None = None
        self._problems = ProblemLog(log, "host problem", "host problem resolved")

    @property
    def inventory(self) -> Any:
        return self.scan.inventory

    # -- pieces ----------------------------------------------------------------------------------------------------
    async def check_liveness(self) -> str | None:
        return await check_own_sockets(str(self.plugin.registration_socket), str(self.plugin.dra_socket))

    def watch_paths(self) -> list[Path]:
        scanner = self.profile.scanner
        return [*scanner.watch_paths(self.paths, self.inventory), scanner.coexistence.dra_watch_path(self.paths)]

    def _look(self) -> tuple[Scan[Any], str | None, frozenset[str], list[Path]]:
        """The host scan, whether the device plugin is here too and which devices its pods hold, and the health
        files to poll, read together in a worker thread."""
        scan = self.profile.scan(self.paths, self.dra_version)
        scanner = self.profile.scanner
        held = self.holds.held(scanner.device_plugin_ids(scan.inventory))
        return (scan, scanner.coexistence.dra_sharing_note(self.paths), held,
                scanner.health_files(self.paths, scan.inventory))

    async def rescan(self) -> Scan[Any]:
        """Re-read the host (off the event loop) and hand the result to the publisher; returns what it found."""
        self.scan, sharing, held, health_files = await asyncio.to_thread(self._look)
        self.driver.set_inventory(self.scan.inventory)
        self.poller.watch(health_files)  # a few opens and preads, as the device plugins do on their loop
        self._problems.update(("", p) for p in self.scan.problems)
        if sharing != self._sharing_logged:
            if sharing:
                log.warning("the device plugin is on this node too", extra=kv(driver=self.driver_name, note=sharing))
            elif self._sharing_logged:
                log.info("the device plugin has left this node", extra=kv(driver=self.driver_name))
            self._sharing_logged = sharing
        if held != self.held:
            log.info("devices held by device-plugin pods stay unpublished until those pods end",
                     extra=kv(driver=self.driver_name, held=sorted(held) or None))
            self.held = held
        self.metrics.held_by_device_plugin.set(len(held))
        self.own_node.want(labels=self.scan.node_labels, annotations=self.scan.node_annotations)
        self._hand_over()
        return self.scan

    def _hand_over(self) -> None:
        """The publishable devices, tainted as of now, to the publisher (also when a NoExecute hold ends)."""
        devices = self.taints.apply([d for d in self.scan.devices if d.name not in self.held], self.scan.health)
        devices = with_attributes(devices, self.node_labels.attributes if self.node_labels is not None else {})
        self.driver.set_published(devices)
        if self.publisher is None:
            return
        try:
            self.publisher.set_devices(devices, self.scan.counters if devices else ())
        except SliceValidationError as exc:
            log.error("not publishing: a device breaks the ResourceSlice limits", extra=kv(error=exc))

    def _seed_taints(self, published: dict[str, tuple[Taint, ...]]) -> None:
        """The publisher's first listing: keep the unhealthy-since times of taints that persist across a restart."""
        if self.taints.seed(published):
            self._hand_over()

    def _health(self) -> dict[str, DeviceHealth]:
        """Every published device's health, in pool order (healthy when the profile says nothing)."""
        return {d.name: self.scan.health.get(d.name, HEALTHY) for d in self.scan.devices}

    # -- life cycle ------------------------------------------------------------------------------------------------
    async def run(self, stop: asyncio.Event) -> None:
        """Serve until ``stop``; InstanceConflict (before anything is read or written) when another live process
        serves the same sockets."""
        self.plugin.instance.acquire()  # a no-op when the caller took it already (the CLI, to exit 2)
        try:
            await self._run(stop)
        finally:
            self.plugin.instance.release()

    async def _run(self, stop: asyncio.Event) -> None:
        await self.rescan()
        if self.client is not None and self.scan.node_label_attributes:
            self.node_labels = NodeLabelWatch(self.client, self.node_name, self.scan.node_label_attributes,
                                              self._hand_over)
        if self.scan.devices:
            log.info("devices found", extra=kv(driver=self.driver_name, node=self.node_name,
                                               devices=len(self.scan.devices), **self.scan.summary))
        else:
            log.info("no devices on this node; publishing no ResourceSlices and staying up",
                     extra=kv(driver=self.driver_name, node=self.node_name, host_root=str(self.paths.host_root)))
        async with self.plugin.exclusive():  # another pod of a rolling update may be mid-prepare
            loaded = await asyncio.to_thread(self.store.load)
            restored = await asyncio.to_thread(self.driver.restore)
            orphans = await asyncio.to_thread(self.driver.remove_orphan_specs)
        log.info("checkpoint loaded", extra=kv(path=str(self.store.path), claims=loaded.claims,
                                               rebooted=loaded.rebooted, cdi_specs_recreated=len(restored),
                                               orphan_cdi_specs_removed=len(orphans)))
        self.driver.set_health(self._health())
        await self.plugin.start()
        if self.liveness is not None:
            await self.liveness.start()
        tasks: list[asyncio.Task[None]] = []
        if self.publisher is not None:
            tasks.append(asyncio.create_task(self._publish(stop)))
            tasks.append(asyncio.create_task(self.taints.run(stop, self._hand_over)))
        else:
            log.error("no API server configuration (KUBECONFIG or in-cluster): no ResourceSlices will be published")
        if self.client is not None and (self.scan.node_labels or self.scan.node_annotations):
            tasks.append(asyncio.create_task(self._own_node(stop)))
        if self.node_labels is not None:
            tasks.append(asyncio.create_task(self.node_labels.run(stop)))
        if self.status is not None:
            tasks.append(asyncio.create_task(self.status.run(stop)))
        if self.reporter is not None:
            tasks.append(asyncio.create_task(self.reporter.run(stop)))
            self.reporter.health_changed(self._health(), self.store.claims())  # unhealthy since the last run
        tasks.append(asyncio.create_task(self.presence.run(stop)))
        tasks.append(asyncio.create_task(self.presence.check_access()))
        if self.client is not None and self.cleanup_interval > 0:
            tasks.append(asyncio.create_task(self.cleaner.run(stop, self.cleanup_interval)))
        self.ready.set()
        try:
            await self._watch_host(stop)
        finally:
            await self._shutdown(tasks)

    async def _publish(self, stop: asyncio.Event) -> None:
        """Run the slice publisher; with ``registration_wait`` > 0, only once the kubelet has registered this plugin
        (or that many seconds have passed). Slices published first let the scheduler bind a pod whose prepare the
        kubelet then refuses ("DRA driver ... is not registered") and retries only some 15 s later."""
        assert self.publisher is not None
        if self.registration_wait > 0 and not self.plugin.registered_once.is_set():
            waits = [asyncio.create_task(self.plugin.registered_once.wait()), asyncio.create_task(stop.wait())]
            try:
                await asyncio.wait(waits, timeout=self.registration_wait, return_when=asyncio.FIRST_COMPLETED)
            finally:
                for task in waits:
                    task.cancel()
            if stop.is_set():
                return
            if not self.plugin.registered_once.is_set():
                log.warning("the kubelet has not registered the plugin yet; publishing the ResourceSlices anyway",
                            extra=kv(driver=self.driver_name, waited_seconds=self.registration_wait))
        if await self._wait_device_plugin_drained(stop):
            return
        if self.node_labels is not None:  # publish with the label attributes, not once without, once with
            await wake(stop, self.node_labels.read, timeout=NODE_LABELS_WAIT_S)
            if self.node_labels.node is not None:
                self.publisher.know_node(self.node_labels.node)
        await self.publisher.run(stop)

    async def _wait_device_plugin_drained(self, stop: asyncio.Event) -> bool:
        """A device plugin of this hardware may have served the node until now (it stands down as soon as it sees
        our registration, or its pod was just removed from the node by a migration label), and the Node's
        allocatable still offers its resources until the kubelet's next status update. Publish only once none is
        allocatable (at most DRAIN_WAIT_S), so the scheduler never sees the same devices on both sides. The Node
        comes from the label watch when there is one (no request of its own), else from a GET every 0.5 s.
        Returns True when ``stop`` came first."""
        resources = self.profile.scanner.coexistence.device_plugin_resources
        if self.client is None or not resources:
            return False
        if self.node_labels is not None:
            await wake(stop, self.node_labels.read, timeout=NODE_LABELS_WAIT_S)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + DRAIN_WAIT_S
        waited = False
        while loop.time() < deadline:
            news = None
            try:
                node, news = await self._our_node()
                if device_plugin_drained(node, resources):
                    if waited:
                        log.info("the device plugin has stood down (none of its resources allocatable); "
                                 "publishing", extra=kv(driver=self.driver_name))
                    return False
                if not waited:
                    log.info("the device plugin's resources are still allocatable on this Node; waiting to publish",
                             extra=kv(driver=self.driver_name, resources=list(resources), at_most_s=DRAIN_WAIT_S))
                waited = True
            except Exception as exc:  # noqa: BLE001 - the API may be away: keep waiting, then publish
                log.debug("cannot read our Node yet", extra=kv(error=exc))
            if await wake(stop, news, timeout=0.5 if news is None else 2.0) == STOP:
                return True
        log.warning("the device plugin's resources are still allocatable on this Node; publishing anyway",
                    extra=kv(driver=self.driver_name, waited_seconds=DRAIN_WAIT_S, resources=list(resources)))
        return False

    async def _own_node(self, stop: asyncio.Event) -> None:
        """Keep our keys on the Node; with a label watch, from its copies (no GET of its own)."""
        if self.node_labels is not None:
            self.node_labels.observers.append(self.own_node.observe)
            if self.node_labels.node is not None:
                self.own_node.observe(self.node_labels.node)
            else:
                await wake(stop, self.node_labels.read, timeout=NODE_LABELS_WAIT_S)
        await self.own_node.run(stop)

    async def _our_node(self) -> tuple[Any, asyncio.Event | None]:
        """Our Node as of now and the event its next copy sets: the label watch's copy when it has one (no
        request), else one GET (and no event)."""
        watch = self.node_labels
        if watch is not None and watch.node is not None:
            watch.seen.clear()
            return watch.node, watch.seen
        assert self.client is not None
        return await read_node(self.client, self.node_name), None

    async def _watch_host(self, stop: asyncio.Event) -> None:
        async with watching_host(self.watch_paths, self.poller, rescan_interval=self.rescan_interval,
                                 health_poll_interval=self.health_poll_interval, depth=1,
                                 udev_subsystems=udev_subsystems(self.profile.scanner, self.paths)) as watcher:
            refresh = asyncio.create_task(self._refresh_health(stop))
            held_recheck = asyncio.create_task(self._recheck_held(watcher, stop))
            try:
                async for _ in watcher.changes(stop):
                    await self.rescan()
                    await self._report_health()
            finally:
                refresh.cancel()
                held_recheck.cancel()
                await asyncio.gather(refresh, held_recheck, return_exceptions=True)

    async def _recheck_held(self, watcher: ChangeWatcher, stop: asyncio.Event) -> None:
        """While device-plugin pods hold some devices, rescan every HELD_RECHECK_S (their end raises no host event),
        so a freed device is published within seconds."""
        while await wake(stop, timeout=HELD_RECHECK_S) != STOP:
            if self.held:
                watcher.kick("devices held by device-plugin pods")

    async def _report_health(self) -> None:
        """After a rescan: send the full list when health changed."""
        health = self._health()
        if self.driver.set_health(health):
            if self.reporter is not None:
                self.reporter.health_changed(health, self.store.claims())
            unhealthy = [name for name, state in health.items() if not state.healthy]
            log.info("device health changed", extra=kv(driver=self.driver_name, unhealthy=unhealthy or None))
            await self._push_health()

    async def _refresh_health(self, stop: asyncio.Event) -> None:
        """Send the full list again when none went out for ``health_refresh_seconds`` (before the kubelet's
        timeout), however long the host stays quiet."""
        loop = asyncio.get_running_loop()
        self._last_push = loop.time()
        while True:
            due = self._last_push + self.health_refresh_seconds
            if await wake(stop, timeout=max(0.0, due - loop.time())) == STOP:
                return
            if loop.time() >= self._last_push + self.health_refresh_seconds:
                await self._push_health()

    async def _push_health(self) -> None:
        self._last_push = asyncio.get_running_loop().time()
        await self.plugin.health_changed()

    async def _fold_journal(self) -> None:
        """On a clean stop, fold the checkpoint's journal into its snapshot (an older driver, after a rollback,
        reads the snapshot alone); under the locks, since the other pod of a rolling update may be mid-prepare."""
        try:
            async with self.plugin.exclusive():
                await asyncio.to_thread(self.store.compact)
        except (OSError, ClaimError) as exc:  # the journal still holds every change: nothing is lost
            log.warning("could not fold the checkpoint journal into its snapshot", extra=kv(error=exc))

    async def _shutdown(self, tasks: list[asyncio.Task[None]]) -> None:
        if self.liveness is not None:
            await self.liveness.stop()
        await self.plugin.stop()
        for task in tasks:
            try:
                await asyncio.wait_for(task, 5)
            except (TimeoutError, asyncio.CancelledError):
                task.cancel()
        await self._fold_journal()
        leaving = await self.presence.leaving()
        await asyncio.to_thread(self.holds.close)
        removed = False
        if (self.remove_slices_on_exit or leaving) and self.publisher is not None:
            try:  # before the device plugin may serve: never both
                await self.publisher.remove_all()
                removed = True
            except Exception as exc:
                log.warning("could not remove our ResourceSlices on exit", extra=kv(error=exc))
        if leaving and removed:
            await self.presence.leave(leaving)
        elif leaving:
            await self.presence.leave_later(leaving)
        log.info("DRA driver stopped", extra=kv(driver=self.driver_name, node=self.node_name))
