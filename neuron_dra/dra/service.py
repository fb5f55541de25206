"""``neuron-dra-driver serve``: wires discovery, the handler, the kubelet plugin, the slice publisher, the
liveness probe and the host watcher together on one event loop.

Start-up order: discover the devices, load the checkpoint and re-create lost CDI specs, serve the DRA and
registration sockets, start the liveness service, hand the complete device list to the publisher. Afterwards
every host change (inotify on ``/sys/class/neuron_device`` and the device-plugins directory, udev, and a periodic
rescan that also catches counters and /dev nodes) re-runs discovery; the publisher writes only if the
published content changed, and the kubelet's health stream gets a new full list when health changed and at
least every ``health_refresh_seconds`` (20 s; each report carries a 60 s timeout, after which the kubelet would
treat the device's health as unknown). With an API server, stale checkpoint entries are cleaned up once the
sockets are served and then every ``cleanup_interval`` seconds (see :mod:`neuron_dra.dra.cleanup`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Mapping
from dataclasses import replace
from importlib import metadata
from pathlib import Path
from typing import Any

from lightkube import AsyncClient
from prometheus_client import CollectorRegistry

from accel_core.dra.cdi import CdiSpecWriter
from accel_core.dra.checkpoint import read_boot_id
from accel_core.dra.liveness import LivenessServer, check_own_sockets
from accel_core.dra.plugin import DraPlugin
from accel_core.dra.slices import SlicePublisher, SliceValidationError
from accel_core.dra.types import ClaimError
from accel_core.logs import ProblemLog, kv
from accel_core.paths import HostPaths
from accel_core.watch import ChangeWatcher
from neuron_dra.discovery import CLASS_DIR, NeuronDevice, NeuronInventory, discover
from neuron_dra.dra.attributes import DRIVER_NAME, slice_devices
from neuron_dra.dra.claims import ApiClaimReader
from neuron_dra.dra.cleanup import DEFAULT_CLEANUP_INTERVAL, StaleClaimCleaner
from neuron_dra.dra.driver import CDI_CLASS, CDI_VENDOR, NeuronDriver
from neuron_dra.dra.guard import blocked_reason
from neuron_dra.dra.health import DeviceCondition, assess
from neuron_dra.dra.metrics import DriverMetrics
from neuron_dra.dra.store import ClaimStore

log = logging.getLogger(__name__)

DEFAULT_HEALTHCHECK_PORT = 51515
FALLBACK_VERSION = "0.1.0"


def dra_driver_version() -> str:
    """The package version (a semantic version), published as ``draDriverVersion``."""
    try:
        return metadata.version("aws-accel-agents")
    except metadata.PackageNotFoundError:
        return FALLBACK_VERSION


class _NoApiReader:
    async def read(self, namespace: str, name: str) -> Mapping[str, Any] | None:
        raise ClaimError("no API server connection is configured (KUBECONFIG or in-cluster), so claims cannot be read")


class NeuronDraService:
    """One node's Neuron DRA driver. ``client=None`` serves the kubelet but publishes nothing and reads no claims."""

    def __init__(
        self,
        paths: HostPaths,
        *,
        node_name: str,
        client: AsyncClient | None,
        pod_uid: str | None = None,
        healthcheck_port: int = DEFAULT_HEALTHCHECK_PORT,
        rescan_interval: float = 10.0,
        health_refresh_seconds: float = 20.0,
        cleanup_interval: float = DEFAULT_CLEANUP_INTERVAL,
        remove_slices_on_exit: bool = False,
        registry: CollectorRegistry | None = None,
        dra_version: str | None = None,
    ) -> None:
        self.paths = paths
        self.node_name = node_name
        self.client = client
        self.healthcheck_port = healthcheck_port
        self.rescan_interval = rescan_interval
        self.health_refresh_seconds = health_refresh_seconds
        self.cleanup_interval = cleanup_interval
        self.remove_slices_on_exit = remove_slices_on_exit
        self.dra_version = dra_version or dra_driver_version()
        self.registry = registry if registry is not None else CollectorRegistry()
        self.metrics = DriverMetrics(self.registry)
        self.inventory: NeuronInventory = discover(paths)
        self._known: set[int] = {d.index for d in self.inventory.devices}
        self._last_present: dict[int, NeuronDevice] = {d.index: d for d in self.inventory.devices if d.present}
        self.cdi = CdiSpecWriter(paths.cdi_root, CDI_VENDOR, CDI_CLASS)
        data_dir = paths.plugins_data_dir / DRIVER_NAME
        self.store = ClaimStore(data_dir / "checkpoint.json", read_boot_id(paths.host_root))
        self.reader = ApiClaimReader(client) if client is not None else _NoApiReader()
        self.driver = NeuronDriver(node_name=node_name, reader=self.reader, cdi=self.cdi, store=self.store,
                                   inventory=lambda: self.inventory, blocked=self.blocked, metrics=self.metrics)
        self.plugin = DraPlugin(self.driver, paths, pod_uid=pod_uid, registry=self.registry)
        self.cleaner = StaleClaimCleaner(store=self.store, reader=self.reader, unprepare=self.plugin.unprepare_claims,
                                         driver=DRIVER_NAME, pool=node_name, metrics=self.metrics)
        self.publisher = (SlicePublisher(client, DRIVER_NAME, node_name, registry=self.registry)
                          if client is not None else None)
        self.liveness = LivenessServer(self.check_liveness, healthcheck_port) if healthcheck_port >= 0 else None
        self.ready = asyncio.Event()
        self._blocked_logged: str | None = None
        self._problems = ProblemLog(log, "host problem", "host problem resolved")

    # -- pieces ----------------------------------------------------------------------------------------------------
    def blocked(self) -> str | None:
        return blocked_reason(self.paths.device_plugins_dir)

    async def check_liveness(self) -> str | None:
        return await check_own_sockets(str(self.plugin.registration_socket), str(self.plugin.dra_socket))

    def watch_paths(self) -> list[Path]:
        return [self.paths.host(CLASS_DIR), self.paths.device_plugins_dir]

    def rescan(self) -> tuple[NeuronInventory, dict[int, DeviceCondition]]:
        """Re-read the host and hand the result to the publisher and the handler; returns what it found."""
        self.inventory = self._with_last_known_slots(discover(self.paths, known=self._known))
        self._known.update(d.index for d in self.inventory.devices)
        conditions = assess(self.inventory)
        self._problems.update(("", p) for p in self.inventory.all_problems())
        reason = self.blocked()
        if reason != self._blocked_logged:
            if reason:
                log.warning("publishing nothing", extra=kv(reason=reason))
            elif self._blocked_logged:
                log.info("the Neuron device plugin is gone; publishing devices again")
            self._blocked_logged = reason
        if self.publisher is not None:
            devices = [] if reason else slice_devices(self.inventory, self.dra_version, conditions)
            try:
                self.publisher.set_devices(devices)
            except SliceValidationError as exc:
                log.error("not publishing: a device breaks the ResourceSlice limits", extra=kv(error=exc))
        return self.inventory, conditions

    def _with_last_known_slots(self, inv: NeuronInventory) -> NeuronInventory:
        """A vanished device keeps the PCI address, PCIe root and NUMA node it had, so its published identity
        stays put while it is gone (only its taint changes) and it comes back unchanged."""
        devices = []
        for dev in inv.devices:
            last = self._last_present.get(dev.index)
            if dev.present:
                self._last_present[dev.index] = dev
            elif last is not None:
                dev = replace(dev, pci_address=dev.pci_address or last.pci_address,
                              pcie_root=dev.pcie_root or last.pcie_root,
                              numa_node=dev.numa_node if dev.numa_node is not None else last.numa_node)
            devices.append(dev)
        return replace(inv, devices=tuple(devices))

    # -- life cycle ------------------------------------------------------------------------------------------------
    async def run(self, stop: asyncio.Event) -> None:
        inv = self.inventory
        if inv.devices:
            log.info("Neuron devices found", extra=kv(node=self.node_name, instance_type=inv.instance_type or None,
                                                      devices=len(inv.devices), topology=inv.topology.kind,
                                                      lnc=inv.lnc, driver_version=inv.driver_version))
        else:
            log.info("no Neuron devices on this node; publishing no ResourceSlices and staying up",
                     extra=kv(node=self.node_name, host_root=str(self.paths.host_root)))
        loaded = self.store.load()
        restored = self.driver.restore()
        log.info("checkpoint loaded", extra=kv(path=str(self.store.path), claims=loaded.claims,
                                               rebooted=loaded.rebooted, cdi_specs_recreated=len(restored)))
        _, conditions = self.rescan()
        self.driver.set_conditions(conditions)
        await self.plugin.start()
        if self.liveness is not None:
            await self.liveness.start()
        tasks: list[asyncio.Task[None]] = []
        if self.publisher is not None:
            tasks.append(asyncio.create_task(self.publisher.run(stop)))
        else:
            log.error("no API server configuration (KUBECONFIG or in-cluster): no ResourceSlices will be published")
        if self.client is not None and self.cleanup_interval > 0:
            tasks.append(asyncio.create_task(self.cleaner.run(stop, self.cleanup_interval)))
        self.ready.set()
        try:
            await self._watch_host(stop)
        finally:
            await self._shutdown(tasks)

    async def _watch_host(self, stop: asyncio.Event) -> None:
        async with ChangeWatcher(self.watch_paths, rescan_interval=self.rescan_interval, depth=1,
                                 udev_subsystems=("neuron_device",)) as watcher:
            stopper = asyncio.create_task(stop.wait())
            loop = asyncio.get_running_loop()
            last_push = loop.time()
            try:
                while not stop.is_set():
                    change = asyncio.create_task(watcher.next_change())
                    done, _ = await asyncio.wait({change, stopper}, return_when=asyncio.FIRST_COMPLETED)
                    if stopper in done:
                        change.cancel()
                        with contextlib.suppress(asyncio.CancelledError):
                            await change
                        break
                    _, conditions = self.rescan()
                    now = loop.time()
                    if self.driver.set_conditions(conditions):
                        unhealthy = sorted(i for i, c in conditions.items() if not c.healthy)
                        log.info("device health changed", extra=kv(unhealthy=unhealthy or None))
                        await self.plugin.health_changed()
                        last_push = now
                    elif now - last_push >= self.health_refresh_seconds:
                        await self.plugin.health_changed()  # a fresh full list before the kubelet's timeout
                        last_push = now
            finally:
                stopper.cancel()

    async def _shutdown(self, tasks: list[asyncio.Task[None]]) -> None:
        if self.liveness is not None:
            await self.liveness.stop()
        await self.plugin.stop()
        for task in tasks:
            try:
                await asyncio.wait_for(task, 5)
            except (TimeoutError, asyncio.CancelledError):
                task.cancel()
        if self.remove_slices_on_exit and self.publisher is not None:
            try:
                await self.publisher.remove_all()
            except Exception as exc:
                log.warning("could not remove our ResourceSlices on exit", extra=kv(error=exc))
        log.info("Neuron DRA driver stopped", extra=kv(node=self.node_name))
