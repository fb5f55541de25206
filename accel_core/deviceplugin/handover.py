"""The device plugin's side of the coexistence rule (:mod:`accel_core.coexistence`: the DRA driver wins).

:class:`DraHandover` follows the DRA driver of the same accelerator on this node:

- while the driver serves the node (registered, or restarting within its lease), the plugin advertises nothing
  (its policies ask the same rule), says so with an Event on its Node and with its pod's readiness (``/readyz``
  answers 503 naming the driver), and asks to be woken when the lease runs out;
- when it serves after the driver, it posts an Event too: on the change, or at its start when the driver has been on
  the node (its data directory is there), as after a migration rolled back by a node label;
- when it advertises, devices that running pods hold through the driver's claims (the kubelet's PodResources
  ``dynamic_resources``) are advertised Unhealthy, so nothing can allocate them until those pods end; it re-reads
  PodResources every :data:`HELD_RECHECK_S` seconds while any are held.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping

from accel_core.coexistence import DEFAULT_LEASE_S, Coexistence
from accel_core.hostscan import held_device_plugin_ids
from accel_core.logs import kv
from accel_core.nodeevents import NodeEvents
from accel_core.paths import HostPaths
from accel_core.podresources import PodResourcesClient, PodResourcesUnavailable

log = logging.getLogger(__name__)

HELD_RECHECK_S = 5.0
EVENT_STANDING_DOWN = "DevicePluginStandingDown"
EVENT_SERVING = "DevicePluginServing"

DeviceIds = Mapping[str, tuple[tuple[str, str], ...]]


class DraHandover:
    """What the device plugin knows of the DRA driver on its node (see the module docstring)."""

    def __init__(self, coexistence: Coexistence, paths: HostPaths, ids: Callable[[], DeviceIds], *,
                 events: NodeEvents | None = None, lease: float = DEFAULT_LEASE_S) -> None:
        self.coexistence = coexistence
        self.paths = paths
        self.ids = ids
        self.events = events
        self.lease = lease
        self.client = PodResourcesClient(paths.pod_resources_socket)
        self.standing_down: str | None = None  #: why the plugin advertises nothing now (read by /readyz)
        self._held: dict[str, frozenset[str]] = {}
        self._first = True

    def held(self, resource: str) -> frozenset[str]:
        """IDs of ``resource`` that pods hold through the DRA driver's claims (advertised Unhealthy)."""
        return self._held.get(resource, frozenset())

    def not_ready(self) -> str | None:
        return self.standing_down

    def recheck_in(self) -> float | None:
        """Seconds until the rule may change with no file event (the lease ends, held devices may be freed)."""
        left = self.coexistence.lease_left(self.paths, self.lease)
        if left is not None:
            return left + 0.05
        return HELD_RECHECK_S if any(self._held.values()) else None

    async def refresh(self) -> None:
        """Re-read the rule and, when advertising, what DRA claims hold; posts an Event when the side changes."""
        reason = self.coexistence.device_plugin_blocked(self.paths, self.lease)
        if reason != self.standing_down or self._first:
            self._changed(reason)
        self.standing_down = reason
        self._first = False
        if reason is not None:
            self._held = {}
            return
        try:
            response = await self.client.list_async()
        except PodResourcesUnavailable as exc:
            log.debug("PodResources unavailable; keeping what DRA claims were known to hold", extra=kv(error=exc))
            return
        names = {res.device_name for pod in response.pod_resources for container in pod.containers
                 for dynamic in container.dynamic_resources for res in dynamic.claim_resources
                 if res.driver_name == self.coexistence.dra_driver}
        held = {r: frozenset(i) for r, i in held_device_plugin_ids(self.ids(), names).items()} if names else {}
        if held != self._held:
            log.info("devices held by DRA claims are advertised Unhealthy until their pods end",
                     extra=kv(driver=self.coexistence.dra_driver,
                              held={r: sorted(i) for r, i in held.items()} or None))
        self._held = held

    def _changed(self, reason: str | None) -> None:
        what = self.coexistence.what
        if reason is not None:
            log.warning("advertising nothing", extra=kv(reason=reason))
            if self.events is not None:
                self.events.post(EVENT_STANDING_DOWN, f"{what} device plugin advertises nothing: {reason}")
        elif not self._first or self._dra_was_here():
            # A device plugin that starts after the driver left (a rolled-back migration re-creates its pod) says so
            # too: the driver's data directory, with its claim checkpoint, stays on the node after it leaves.
            message = (f"the {what} DRA driver ({self.coexistence.dra_driver}) has left this node; the {what} device "
                       "plugin advertises its devices again")
            log.info(message)
            if self.events is not None:
                self.events.post(EVENT_SERVING, message)

    def _dra_was_here(self) -> bool:
        """The DRA driver has served this node before (its directory under the kubelet's plugins directory)."""
        return (self.paths.plugins_data_dir / self.coexistence.dra_driver).is_dir()

    async def aclose(self) -> None:
        await self.client.aclose()
