"""Events about a daemon's own Node, where ``kubectl describe node`` and ``kubectl get events`` show them.

A Node event is a core/v1 Event in namespace ``default`` whose ``involvedObject`` is the Node with its name as UID
(how the kubelet posts its own node events, and what ``kubectl describe node`` searches for). Posting never blocks
the caller and never fails it: without an API client, or when the API server refuses, the event is logged instead.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from datetime import UTC, datetime
from typing import TYPE_CHECKING

from accel_core.logs import kv
from accel_core.tasks import logged_task

if TYPE_CHECKING:
    from lightkube import AsyncClient

log = logging.getLogger(__name__)

#: an event's message is cut to this many characters (the API server allows 1 KiB)
MAX_MESSAGE = 1000


class NodeEvents:
    """Posts Events about Node ``node_name`` as ``component``; ``client`` is asked for an API client on each post
    (None: no API access, the event is only logged)."""

    def __init__(self, client: Callable[[], AsyncClient | None], node_name: str | None, component: str) -> None:
        self._client = client
        self.node_name = node_name
        self.component = component
        self.posted = 0  #: events the API server accepted (for tests)
        self._tasks: set[asyncio.Task[None]] = set()

    def post(self, reason: str, message: str, *, warning: bool = False) -> None:
        """Post one event soon (on the running loop); returns at once."""
        if not self.node_name:
            return
        task = logged_task(self._post(reason, message[:MAX_MESSAGE], "Warning" if warning else "Normal"),
                           "node event")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _post(self, reason: str, message: str, kind: str) -> None:
        client = self._client()
        if client is None:
            log.info("node event (no API access)", extra=kv(reason=reason, message=message))
            return
        from lightkube.core.exceptions import ApiError
        from lightkube.models.core_v1 import EventSource, ObjectReference
        from lightkube.models.meta_v1 import ObjectMeta
        from lightkube.resources.core_v1 import Event

        node = self.node_name or ""
        now = datetime.now(UTC)
        event = Event(
            metadata=ObjectMeta(generateName=f"{node}.", namespace="default"),
            involvedObject=ObjectReference(kind="Node", name=node, uid=node, apiVersion="v1"),
            reason=reason, message=message, type=kind, count=1, firstTimestamp=now, lastTimestamp=now,
            source=EventSource(component=self.component, host=node),
            reportingComponent=self.component, reportingInstance=node)
        try:
            await asyncio.wait_for(client.create(event), 10)
        except (ApiError, TimeoutError, OSError) as exc:
            log.warning("could not post a node event", extra=kv(reason=reason, error=exc))
            return
        self.posted += 1

    async def drain(self) -> None:
        """Wait for the events posted so far (at shutdown)."""
        if self._tasks:
            await asyncio.wait(set(self._tasks), timeout=5)


class LazyClient:
    """One API client for a daemon, made on first use (:func:`accel_core.ownnode.optional_client`: None, logged
    once, when there is no configuration), so a daemon that never needs the API never loads lightkube."""

    def __init__(self, kubeconfig: str | None, field_manager: str) -> None:
        self.kubeconfig = kubeconfig
        self.field_manager = field_manager
        self._client: AsyncClient | None = None
        self._made = False

    def __call__(self) -> AsyncClient | None:
        if not self._made:
            from accel_core.ownnode import optional_client

            self._made = True
            self._client = optional_client(self.kubeconfig, self.field_manager)
        return self._client

    async def aclose(self) -> None:
        if self._client is not None:
            await self._client.close()
            self._client = None
