"""The DRA driver's side of the coexistence rule (:mod:`accel_core.coexistence`: the DRA driver wins).

- :class:`DevicePluginHolds` reads the kubelet's PodResources ``List`` (blocking, in the scan thread) for the
  devices running pods still hold through the device plugin, so the driver leaves them out of its ResourceSlices
  until those pods end: no device is handed out twice while a node moves from the device plugin to DRA.
- :class:`Presence` keeps the presence file the device plugin reads: written at start, refreshed every
  :data:`~accel_core.coexistence.HEARTBEAT_S` seconds, left in place when the pod merely restarts (the device plugin
  keeps standing down), removed when the driver leaves the node for good: its DaemonSet is gone or being deleted
  (``helm uninstall``, ``draDriver.enabled=false``), or no longer selects this node (a migration rolled back by a
  node label). Which of the two it is, the API server says at shutdown; when it cannot be asked, the file stays and
  the device plugin takes over once the lease runs out.

``helm uninstall`` deletes the driver's service account and RBAC with its DaemonSet, before the pod is stopped, so
at shutdown the API server answers 401 or 403. A driver that could read its DaemonSet at start takes that as an
uninstall too (a restart never loses RBAC). It can then no longer delete its slices either; the kubelet wipes them
30 s after the plugin's socket is gone (kubelet-apis.md, ``defaultWipingDelay``), so the presence file is kept
until just after that, never both sides at once.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from accel_core.coexistence import DEFAULT_LEASE_S, HEARTBEAT_S, Coexistence, remove_presence, write_presence
from accel_core.hostscan import held_dra_devices
from accel_core.logs import kv
from accel_core.nodeaffinity import selects_node
from accel_core.paths import HostPaths
from accel_core.podresources import PodResourcesClient, PodResourcesUnavailable, devices_in_use
from accel_core.watch import STOP, wake

if TYPE_CHECKING:
    from lightkube import AsyncClient

log = logging.getLogger(__name__)

#: the kubelet wipes a driver's slices this long after no plugin of it is connected (defaultWipingDelay)
KUBELET_WIPE_S = 30.0


class DevicePluginHolds:
    """Which of the driver's devices running pods hold through the device plugin (blocking; scan thread)."""

    def __init__(self, coexistence: Coexistence, paths: HostPaths) -> None:
        self.coexistence = coexistence
        self.client = PodResourcesClient(paths.pod_resources_socket) if coexistence.device_plugin_resources else None
        self._unavailable_logged = False

    def held(self, ids: Mapping[str, tuple[tuple[str, str], ...]]) -> frozenset[str]:
        """DRA device names whose hardware a pod holds through the device plugin ([] when nothing can be asked)."""
        if self.client is None or not ids:
            return frozenset()
        try:
            in_use = devices_in_use(self.client.list(), self.coexistence.device_plugin_resources)
        except PodResourcesUnavailable as exc:
            if not self._unavailable_logged:
                log.info("cannot ask the kubelet which devices device-plugin pods hold; publishing every device",
                         extra=kv(error=exc))
                self._unavailable_logged = True
            return frozenset()
        self._unavailable_logged = False
        return held_dra_devices(ids, in_use)

    def close(self) -> None:
        if self.client is not None:
            self.client.close()


class Presence:
    """The presence file of one DRA driver on its node (see the module docstring)."""

    def __init__(self, coexistence: Coexistence, paths: HostPaths, *, node: str, pod_uid: str | None,
                 client: AsyncClient | None = None, daemonset: tuple[str, str] | None = None,
                 heartbeat: float = HEARTBEAT_S) -> None:
        self.path = coexistence.presence_file(paths)
        self.node = node
        self.pod_uid = pod_uid or ""
        self.client = client
        self.daemonset = daemonset
        self.heartbeat = heartbeat
        self.can_tell = False  #: the DaemonSet could be read once, so a refusal at shutdown means an uninstall

    def write(self) -> None:
        write_presence(self.path, pod_uid=self.pod_uid, node=self.node)

    async def run(self, stop: asyncio.Event) -> None:
        """Write the file now and refresh it until ``stop``; a failed write is logged once and retried."""
        failing = False
        while True:
            try:
                await asyncio.to_thread(self.write)
                if failing:
                    log.info("presence file written again", extra=kv(path=str(self.path)))
                failing = False
            except OSError as exc:
                if not failing:
                    log.warning("cannot write the presence file the device plugin reads; it takes over once the "
                                "lease runs out", extra=kv(path=str(self.path), error=exc))
                failing = True
            if await wake(stop, timeout=self.heartbeat) == STOP:
                return

    async def check_access(self) -> None:
        """At start: read our DaemonSet once, so a refusal at shutdown can be told from missing RBAC."""
        if self.client is None or self.daemonset is None:
            return
        from lightkube import ApiError
        from lightkube.resources.apps_v1 import DaemonSet

        namespace, name = self.daemonset
        try:
            await asyncio.wait_for(self.client.get(DaemonSet, name, namespace=namespace), 10)
        except ApiError as exc:
            log.warning("cannot read our own DaemonSet: at shutdown an uninstall will look like a restart, and the "
                        "device plugin takes over only after its lease", extra=kv(daemonset=f"{namespace}/{name}",
                                                                                  error=exc))
            return
        except Exception as exc:  # noqa: BLE001 - the API server may be away; asked again at shutdown
            log.info("could not read our own DaemonSet yet", extra=kv(error=exc))
            return
        self.can_tell = True

    async def leave_later(self, why: str, after: float = KUBELET_WIPE_S + 2.0) -> None:
        """Leaving, but the slices could not be deleted: keep the file so that it runs out ``after`` seconds from
        now, once the kubelet has wiped the slices."""
        now = time.time()
        then = now - max(0.0, DEFAULT_LEASE_S - after)
        try:
            await asyncio.to_thread(os.utime, self.path, (then, then))
        except OSError as exc:
            log.warning("cannot shorten the presence file's lease", extra=kv(path=str(self.path), error=exc))
            return
        log.info("leaving the node; the device plugin may serve it once the kubelet has wiped our slices",
                 extra=kv(reason=why, seconds=after))

    async def leave(self, why: str) -> None:
        """Remove the file: the driver leaves the node for good (``why``), the device plugin may serve it now."""
        try:
            removed = await asyncio.to_thread(remove_presence, self.path)
        except OSError as exc:
            log.warning("cannot remove the presence file; the device plugin takes over once the lease runs out",
                        extra=kv(path=str(self.path), error=exc))
            return
        log.info("leaving the node: the device plugin may serve it now", extra=kv(reason=why, removed=removed))

    async def leaving(self) -> str | None:
        """At shutdown: why this driver leaves the node for good, or None (a restart, or the API cannot say: the
        file stays, and the device plugin keeps standing down until the lease runs out)."""
        if self.client is None or self.daemonset is None:
            return None
        from lightkube import ApiError
        from lightkube.resources.apps_v1 import DaemonSet

        namespace, name = self.daemonset
        try:
            ds = await asyncio.wait_for(self.client.get(DaemonSet, name, namespace=namespace), 5)
        except ApiError as exc:
            if exc.status.code == 404:
                return f"DaemonSet {namespace}/{name} is gone"
            if exc.status.code in (401, 403) and self.can_tell:
                return f"our service account or its RBAC is gone ({exc.status.code}): the release is uninstalled"
            log.info("cannot read our DaemonSet at shutdown; keeping the presence file", extra=kv(error=exc))
            return None
        except Exception as exc:  # noqa: BLE001 - any failure means "cannot say"
            log.info("cannot read our DaemonSet at shutdown; keeping the presence file", extra=kv(error=exc))
            return None
        if ds.metadata is not None and ds.metadata.deletionTimestamp is not None:
            return f"DaemonSet {namespace}/{name} is being deleted"
        try:
            node = await read_node(self.client, self.node)
        except Exception as exc:  # noqa: BLE001
            log.info("cannot read our Node at shutdown; keeping the presence file", extra=kv(error=exc))
            return None
        labels = dict(node.metadata.labels or {}) if node.metadata is not None else {}
        pod_spec = _pod_spec(ds)
        if not selects_node(pod_spec, labels, self.node):
            return f"DaemonSet {namespace}/{name} no longer selects node {self.node}"
        log.info("stopping, not leaving: the device plugin keeps standing down while this driver restarts",
                 extra=kv(path=str(self.path)))
        return None


async def read_node(client: AsyncClient, node: str) -> Any:
    """One GET of Node ``node`` (5 s at most)."""
    from lightkube.resources.core_v1 import Node

    return await asyncio.wait_for(client.get(Node, node), 5)


def device_plugin_drained(node: Any, resources: tuple[str, ...]) -> bool:
    """True when the Node's allocatable shows none of the device plugin's resources (it has stood down and the
    kubelet has said so), so slices published now are never offered beside them."""
    allocatable = (node.status.allocatable or {}) if node.status is not None else {}
    return all(str(allocatable.get(r, "0")) == "0" for r in resources)


def _pod_spec(ds: Any) -> Mapping[str, Any]:
    """The DaemonSet's pod template spec as a plain mapping."""
    spec = ds.spec.template.spec if ds.spec is not None and ds.spec.template is not None else None
    return spec.to_dict() if spec is not None else {}
