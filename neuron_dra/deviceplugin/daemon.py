"""``neuron-device-plugin serve`` once registered: the profile the device-plugin service runs (both policies on one
node state, a PodResources poller, the device-usage annotation and UltraServer labels on our Node, metrics)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from accel_core.deviceplugin import DevicePluginServer
from accel_core.deviceplugin.daemon import DevicePluginService
from accel_core.deviceplugin.policy import DevicePluginProfile
from accel_core.hostscan import HostScan
from accel_core.metrics import CallbackCollector
from accel_core.nodeevents import LazyClient
from accel_core.ownnode import OwnNode
from accel_core.tasks import logged_task
from accel_core.watch import STOP, wake
from neuron_dra.deviceplugin.metrics import NeuronMetrics
from neuron_dra.deviceplugin.node import NeuronNode
from neuron_dra.deviceplugin.options import ServeOptions
from neuron_dra.deviceplugin.podresources import PodResourcesPoller
from neuron_dra.deviceplugin.policy import NeuronCorePolicy, NeuronDevicePolicy, PolicyMetrics
from neuron_dra.deviceplugin.publish import UsagePublisher
from neuron_dra.discovery import NeuronInventory
from neuron_dra.facts import ultraserver

log = logging.getLogger(__name__)


class Refresher:
    """Re-sends both device lists (then runs ``after``, the usage annotation) soon after usage changes; callable
    from synchronous policy code.

    The pass starts ``delay`` seconds later, not inside the Allocate that caused it: the kubelet gets its answer
    first, and the Allocates of one pod's containers (a burst) fold into one pass. Calls that arrive while a pass
    runs are folded into one more pass.
    """

    def __init__(self, servers: list[DevicePluginServer], after: Callable[[], None] | None = None, *,
                 delay: float = 0.005) -> None:
        self._servers = servers
        self._after = after
        self._delay = delay
        self._task: asyncio.Task[None] | None = None
        self._again = False

    def __call__(self) -> None:
        if self._task is not None and not self._task.done():
            self._again = True
            return
        self._task = logged_task(self._refresh(), "device list refresh")

    async def _refresh(self) -> None:
        await asyncio.sleep(self._delay)
        while True:
            self._again = False
            for server in self._servers:
                await server.refresh()
            if self._after is not None:
                self._after()
            if not self._again:
                return


#: how long the Node labels wait for the first Register before starting anyway (a node without Neuron devices)
OWN_NODE_DELAY_S = 5.0


async def own_node_labels(own: OwnNode, client: LazyClient, registered: asyncio.Event,
                          stop: asyncio.Event) -> None:
    """Keep our Node labels, starting once the kubelet has our first registration (or after OWN_NODE_DELAY_S):
    the Kubernetes client is not needed for serving, so loading it waits until the kubelet knows us."""
    if not own.node_name or await wake(stop, registered, timeout=OWN_NODE_DELAY_S) == STOP:
        return
    own.client = client()
    await own.run(stop)


class NeuronPlugin(DevicePluginProfile[NeuronInventory]):
    """The Neuron device plugin's profile: one :class:`NeuronNode` behind both policies; what is in use (Allocate
    records confirmed by a PodResources poller) re-sends both lists and is published on our Node as the
    device-usage annotation after every change (publish.py), next to the UltraServer labels."""

    def __init__(self, service: DevicePluginService, options: ServeOptions, node: NeuronNode | None = None) -> None:
        # --rescan-interval is the full-rescan period its help promises; the health polls in between stay quick
        self.node = node if node is not None else NeuronNode(
            service.paths, numbering=options.core_numbering, grace=options.allocation_grace,
            full_rescan_interval=options.rescan_interval)
        self.scanner = self.node.scanner
        shared = PolicyMetrics(service.registry)
        self.policies = (NeuronDevicePolicy(self.node, shared), NeuronCorePolicy(self.node, shared))
        self.service = service
        self.own = OwnNode(None, options.node_name)  # its API client comes after the first Register
        self.usage = UsagePublisher(self.node, self.own)
        on_change = Refresher(service.servers, self.usage.publish)
        self.poller = PodResourcesPoller(service.paths.pod_resources_socket, self.node.usage, on_change,
                                         interval=options.pod_resources_interval,
                                         idle_interval=options.pod_resources_idle_interval, registry=service.registry)
        self.node.on_change = _then(on_change, self.poller.kick)  # an Allocate: List soon, even on an idle node
        service.registry.register(CallbackCollector(NeuronMetrics(self.node).produce))

    def update(self, scan: HostScan[NeuronInventory]) -> None:
        self.node.update(scan)
        self.own.want(labels=ultraserver.node_labels(self.node.inventory.ultraserver))
        self.usage.publish()

    async def start(self, stop: asyncio.Event) -> list[asyncio.Task[None]]:
        """Learn what pods already hold before advertising anything (closes the window after a plugin restart)."""
        try:
            await self.poller.poll_once()
        except Exception:  # never fatal: the poller keeps trying
            log.exception("first PodResources List failed")
        registered, client = self.service.servers[0].registered, self.service.client
        assert client is not None  # made before the profile is loaded
        return [logged_task(self.poller.run(stop), "PodResources poller"),
                logged_task(own_node_labels(self.own, client, registered, stop), "Node publisher")]


def _then(first: Callable[[], None], second: Callable[[], None]) -> Callable[[], None]:
    def both() -> None:
        first()
        second()
    return both
