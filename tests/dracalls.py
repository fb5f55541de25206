"""A DRA driver's calls as production makes them (:class:`~accel_core.dra.pluginserver.DraPlugin`, in a DRA server
thread): the claims read first, then the request prepared, both in a worker thread with the event loop free for
readers whose client belongs to it. For tests that call a driver or a plugin without the gRPC server."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from typing import Any

import msgspec
from lightkube.resources.resource_v1 import ResourceClaim

from accel_core.dra.config import OpaqueEntry, configs_for_requests
from accel_core.dra.pluginserver import DraPlugin, Results
from accel_core.dra.preparation import DraDriver
from accel_core.dra.profile import DraProfile
from accel_core.dra.types import ClaimRef, PreparedDevice


def prepare(driver: DraDriver, refs: Sequence[ClaimRef]) -> Mapping[str, list[PreparedDevice] | Exception]:
    """One prepare request: each UID maps to its devices or its exception."""
    async def run() -> Mapping[str, list[PreparedDevice] | Exception]:
        loop = asyncio.get_running_loop()

        def work() -> Mapping[str, list[PreparedDevice] | Exception]:
            return driver.prepare_blocking(refs, loop, prefetched=driver.prefetch_blocking(refs, loop))

        return await asyncio.to_thread(work)

    return asyncio.run(run())


def prepare_one(driver: DraDriver, ref: ClaimRef) -> list[PreparedDevice]:
    """A request of one claim: its devices, or its exception raised."""
    result = prepare(driver, [ref])[ref.uid]
    if isinstance(result, Exception):
        raise result
    return result


def unprepare_one(driver: DraDriver, ref: ClaimRef) -> None:
    """An unprepare request of one claim; its exception raised."""
    error = driver.unprepare_blocking([ref])[ref.uid]
    if error is not None:
        raise error


async def plugin_prepare(plugin: DraPlugin, refs: Sequence[ClaimRef]) -> Results:
    """The plugin's prepare of one request, from a worker thread as the DRA server runs it."""
    return await asyncio.to_thread(plugin.prepare_claims_blocking, list(refs), asyncio.get_running_loop())


def configs(profile: DraProfile[Any, Any], entries: Sequence[OpaqueEntry], requests: Sequence[str]) -> dict[str, Any]:
    """Each request's effective config as the driver decodes a claim's: the core's precedence, the profile's decoder."""
    return configs_for_requests(entries, requests, driver=profile.driver_name, decode=profile.decode_config,
                                default=profile.default_config)


class DictClaimReader:
    """Claims kept as API dicts by (namespace, name), read on production's blocking path (``read_blocking``, in the
    prepare thread) and by asyncio callers (``read``)."""

    def __init__(self) -> None:
        self.claims: dict[tuple[str, str], dict[str, Any]] = {}

    async def read(self, namespace: str, name: str) -> ResourceClaim | None:
        return self.read_blocking(namespace, name)

    def read_blocking(self, namespace: str, name: str) -> ResourceClaim | None:
        found = self.claims.get((namespace, name))
        return None if found is None else msgspec.convert(found, ResourceClaim)
