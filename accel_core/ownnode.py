"""Keep the labels and annotations a daemon owns on its own Node object right.

A daemon says what it wants (``want(labels=..., annotations=...)``; a value of ``None`` means "remove this key") and
:meth:`OwnNode.run` writes the difference with one JSON merge patch on ``metadata`` (nothing else of the Node is
touched, and keys the daemon does not own are left alone). Writes happen only when the wanted state differs from
what was last written or read back, bursts are coalesced (``settle`` seconds), failures are retried with a backoff
that resets on success, and the Node is read again every ``recheck`` seconds so a key someone else changed is put
back. Without an API client it logs once and does nothing, so a daemon never fails for it. A daemon that already
watches its Node hands each copy to :meth:`OwnNode.observe`: the copies count as reads (no GET, no periodic re-read),
and a key someone else changed is put back at once.

Which keys a daemon may write is the API server's decision (RBAC plus an admission policy that limits a node-bound
token to its own Node and to the daemon's keys); a refusal is logged with the API's message and retried slowly.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from accel_core.backoff import Backoff
from accel_core.logs import kv
from accel_core.watch import STOP, TIMEOUT, wake

if TYPE_CHECKING:  # lightkube loads when the API is first used, not at daemon start (start -> Register is faster)
    from lightkube import AsyncClient

log = logging.getLogger(__name__)

Wanted = dict[str, str | None]


class OwnNode:
    """Labels and annotations of Node ``node_name`` that this daemon owns."""

    def __init__(
        self,
        client: AsyncClient | None,
        node_name: str | None,
        *,
        settle: float = 0.2,
        recheck: float = 300.0,
        backoff_initial: float = 0.5,
        backoff_max: float = 30.0,
    ) -> None:
        self.client = client
        self.node_name = node_name
        self.settle = settle
        self.recheck = recheck
        self.backoff_initial = backoff_initial
        self.backoff_max = backoff_max
        self._labels: Wanted = {}
        self._annotations: Wanted = {}
        self._written: tuple[Wanted, Wanted] | None = None
        self._watched: Any = None  # the last copy of the Node a watch handed to observe()
        self._changed = asyncio.Event()
        #: Set after every successful write or read-back that found nothing to do (for tests and benchmarks).
        self.in_sync = asyncio.Event()
        self.writes = 0

    def want(self, *, labels: Mapping[str, str | None] | None = None,
             annotations: Mapping[str, str | None] | None = None) -> None:
        """Replace the wanted values of the given keys (other owned keys keep their wanted value)."""
        new_labels = {**self._labels, **(labels or {})}
        new_annotations = {**self._annotations, **(annotations or {})}
        if (new_labels, new_annotations) != (self._labels, self._annotations):
            self._labels, self._annotations = new_labels, new_annotations
            self.in_sync.clear()
            self._changed.set()

    def wanted(self) -> tuple[Wanted, Wanted]:
        return dict(self._labels), dict(self._annotations)

    def observe(self, node: Any) -> None:
        """A copy of the Node from the daemon's watch: what it holds of our keys is what is written, and a
        difference from what we want wakes the writer (a copy from before our own last write, still on its way,
        costs at most one repeated patch)."""
        self._watched = node
        labels, annotations = self.wanted()
        held = _held(node, labels, annotations)
        self._written = held
        if held != (labels, annotations):
            self.in_sync.clear()
            self._changed.set()
        elif not self._changed.is_set():
            self.in_sync.set()

    async def run(self, stop: asyncio.Event) -> None:
        """Write changes until ``stop``; never raises for API errors."""
        if self.client is None or not self.node_name:
            log.warning("no API server configuration or node name: not publishing node labels/annotations",
                        extra=kv(node=self.node_name))
            return
        from lightkube import ApiError

        backoff = Backoff(self.backoff_initial, self.backoff_max)
        while not stop.is_set():
            try:
                await self._sync()
                backoff.reset()
                timeout = None if self._watched is not None else self.recheck  # a watch shows every change
            except ApiError as exc:
                timeout = backoff.next()
                log.warning("could not update our Node", extra=kv(
                    node=self.node_name, code=exc.status.code, error=exc.status.message,
                    retry_in=round(timeout, 2)))
            except Exception as exc:  # the API server is away (connection errors) or answered nonsense
                timeout = backoff.next()
                log.warning("could not reach the API server for our Node",
                            extra=kv(node=self.node_name, error=repr(exc), retry_in=round(timeout, 2)))
            woke = await wake(stop, self._changed, timeout=timeout)
            if woke == STOP:
                break
            if woke == TIMEOUT:
                self._written = None  # recheck or retry: read the Node again
            else:
                await asyncio.sleep(self.settle)  # coalesce a burst of changes into one write

    async def _sync(self) -> None:
        from lightkube.resources.core_v1 import Node
        from lightkube.types import PatchType

        assert self.client is not None and self.node_name
        self._changed.clear()
        labels, annotations = self.wanted()
        if self._written is None:
            node = self._watched if self._watched is not None else await self.client.get(Node, self.node_name)
            self._written = _held(node, labels, annotations)
        done_labels, done_annotations = self._written
        patch_labels = {k: v for k, v in labels.items() if done_labels.get(k) != v}
        patch_annotations = {k: v for k, v in annotations.items() if done_annotations.get(k) != v}
        if patch_labels or patch_annotations:
            meta_patch: dict[str, object] = {}
            if patch_labels:
                meta_patch["labels"] = patch_labels
            if patch_annotations:
                meta_patch["annotations"] = patch_annotations
            await self.client.patch(Node, self.node_name, {"metadata": meta_patch}, patch_type=PatchType.MERGE)
            self.writes += 1
            log.info("updated our Node", extra=kv(node=self.node_name, labels=patch_labels or None,
                                                  annotations=sorted(patch_annotations) or None))
        self._written = (labels, annotations)
        if not self._changed.is_set():
            self.in_sync.set()


def optional_client(kubeconfig: str | None, field_manager: str) -> AsyncClient | None:
    """An API client from ``kubeconfig``, else KUBECONFIG, else the in-cluster config; None (logged) when there is
    none, so a daemon that only labels its Node runs on without it."""
    from lightkube import AsyncClient
    from lightkube.core.exceptions import ConfigError

    from accel_core.kubeconfig import load_kubeconfig

    try:
        return AsyncClient(load_kubeconfig(kubeconfig), field_manager=field_manager)
    except (ConfigError, OSError, ValueError) as exc:
        log.warning(f"no usable API server configuration: not updating our Node: {exc}", extra=kv(error=exc))
        return None


def _held(node: Any, labels: Wanted, annotations: Wanted) -> tuple[Wanted, Wanted]:
    """The values ``node`` has for the keys of ``labels`` and ``annotations`` (None: absent)."""
    meta = node.metadata
    return ({k: (meta.labels or {}).get(k) for k in labels} if meta else {},
            {k: (meta.annotations or {}).get(k) for k in annotations} if meta else {})
