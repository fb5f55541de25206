"""``neuron-device-plugin serve``: two kubelet registrations, one host watcher, a PodResources poller, metrics."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from prometheus_client import CollectorRegistry

from accel_core.awsfacts import ultraserver
from accel_core.deviceplugin import DevicePluginPolicy, DevicePluginServer
from accel_core.deviceplugin.handover import DraHandover
from accel_core.deviceplugin.runner import serve_device_plugins
from accel_core.logs import kv
from accel_core.metrics import CallbackCollector, serve_metrics
from accel_core.nodeevents import LazyClient, NodeEvents
from accel_core.ownnode import OwnNode
from accel_core.paths import HostPaths
from accel_core.tasks import logged_task
from accel_core.watch import STOP, wake
from neuron_dra.deviceplugin.metrics import NeuronMetrics
from neuron_dra.deviceplugin.node import NeuronNode
from neuron_dra.deviceplugin.options import ServeOptions as ServeOptions
from neuron_dra.deviceplugin.podresources import PodResourcesPoller
from neuron_dra.deviceplugin.policy import NeuronCorePolicy, NeuronDevicePolicy, PolicyMetrics
from neuron_dra.deviceplugin.publish import UsagePublisher

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


class NodeLabels:
    """Keeps the labels this daemon owns on its Node in line with the host after every rescan (add keys here:
    each ``want`` call names the keys it owns)."""

    def __init__(self, node: NeuronNode, own: OwnNode) -> None:
        self.node = node
        self.own = own

    def update(self) -> None:
        self.own.want(labels=ultraserver.node_labels(self.node.inventory.ultraserver))

    def rediscover(self) -> None:
        self.node.rediscover()
        self.update()


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


async def serve(paths: HostPaths, options: ServeOptions, stop: asyncio.Event, *,
                registry: CollectorRegistry | None = None, node: NeuronNode | None = None,
                servers: list[DevicePluginServer] | None = None) -> None:
    """Serve ``aws.amazon.com/neuron`` and ``aws.amazon.com/neuroncore`` until ``stop`` is set.

    ``servers`` started early without policies (``cli.main``: registered before this module loaded) get theirs
    once the first scan and the first PodResources List are done. ``node`` may be passed in to inspect the shared
    state (tests, benchmarks). What is in use is published on our Node as the device-usage annotation after every
    change (publish.py), next to the labels.
    """
    registry = registry if registry is not None else CollectorRegistry()
    if node is None:
        # --rescan-interval is the full-rescan period its help promises; the health polls in between stay quick
        node = NeuronNode(paths, numbering=options.core_numbering, grace=options.allocation_grace,
                          full_rescan_interval=options.rescan_interval)
    await asyncio.to_thread(node.rediscover)  # off the loop: the kubelet may be calling the early servers
    shared = PolicyMetrics(registry)
    policies: list[DevicePluginPolicy] = [NeuronDevicePolicy(node, shared), NeuronCorePolicy(node, shared)]
    early = servers
    if servers is None:
        servers = [DevicePluginServer(policy, paths, registry=registry, retry_interval=options.retry_interval)
                   for policy in policies]
    own = OwnNode(None, options.node_name)  # its API client comes after the first Register (own_node_labels)
    client = LazyClient(options.kubeconfig, "neuron-device-plugin")
    handover = DraHandover(node.scanner.coexistence, paths, lambda: node.scanner.device_plugin_ids(node.inventory),
                           events=NodeEvents(client, options.node_name, "neuron-device-plugin"))
    labelled = NodeLabels(node, own)
    labelled.update()
    usage = UsagePublisher(node, own)
    usage.publish()
    on_change = Refresher(servers, usage.publish)
    poller = PodResourcesPoller(paths.pod_resources_socket, node.usage, on_change,
                                interval=options.pod_resources_interval,
                                idle_interval=options.pod_resources_idle_interval, registry=registry)
    node.on_change = _then(on_change, poller.kick)  # an Allocate: List soon, even on an idle node
    registry.register(CallbackCollector(NeuronMetrics(node).produce))
    http = serve_metrics(registry, options.metrics_port, options.metrics_address, not_ready=handover.not_ready)
    log.info("neuron device plugin starting", extra=kv(**paths.describe(), core_numbering=options.core_numbering,
                                                       rescan_s=options.rescan_interval,
                                                       health_poll_s=options.health_poll_interval))
    # learn what pods already hold before advertising anything (closes the window after a plugin restart)
    try:
        await poller.poll_once()
    except Exception:  # never fatal: the poller keeps trying
        log.exception("first PodResources List failed")
    await handover.refresh()  # and what DRA claims hold, and whether the DRA driver serves this node
    for server in servers:
        server.held = handover.held
    if early is not None:  # advertise only now, knowing what pods hold
        for server, policy in zip(early, policies, strict=True):
            await server.attach(policy, registry)
    poll_task = logged_task(poller.run(stop), "PodResources poller")
    own_task = logged_task(own_node_labels(own, client, servers[0].registered, stop), "Node publisher")
    try:
        await serve_device_plugins(servers, _then(labelled.rediscover, usage.publish), node.watch_paths, stop,
                                   rescan_interval=options.rescan_interval,
                                   udev_subsystems=node.scanner.udev_subsystems, health_files=node.health_files,
                                   poll_interval=options.health_poll_interval, handover=handover)
    finally:
        stop.set()
        # a task that died was logged when it did (logged_task); its error must not hide this shutdown
        await asyncio.gather(poll_task, own_task, return_exceptions=True)
        await handover.aclose()
        if handover.events is not None:
            await handover.events.drain()
        await client.aclose()
        if http is not None:
            http.shutdown()


def _then(first: Callable[[], None], second: Callable[[], None]) -> Callable[[], None]:
    def both() -> None:
        first()
        second()
    return both
