"""The kubelet's DRA gRPC services over a plugin (:class:`accel_core.dra.pluginserver.DraPlugin`): the wire side only.

- ``DraV1Service``, ``DraV1beta1Service``: NodePrepareResources and NodeUnprepareResources of
  ``k8s.io.kubelet.pkg.apis.dra.v1`` / ``v1beta1``, each call answered by the plugin in the server's thread;
- ``HealthService``: ``NodeWatchResources`` of the health API (v1alpha1), messages cut to HEALTH_MESSAGE_MAX;
- ``RegistrationService``: the plugin-registration ``GetInfo`` and ``NotifyRegistrationStatus`` (asyncio).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, Protocol

import grpc

from accel_core.dra.types import ClaimRef, DeviceHealthReport, PreparedDevice
from accel_core.grpc_types import Ctx
from accel_core.kubeletapi import dra_health_v1alpha1_pb2 as hp
from accel_core.kubeletapi import dra_health_v1alpha1_pb2_grpc as hp_grpc
from accel_core.kubeletapi import dra_v1_pb2 as d1
from accel_core.kubeletapi import dra_v1_pb2_grpc as d1_grpc
from accel_core.kubeletapi import dra_v1beta1_pb2 as d1b
from accel_core.kubeletapi import dra_v1beta1_pb2_grpc as d1b_grpc
from accel_core.kubeletapi import pluginregistration_v1_pb2 as rp
from accel_core.kubeletapi import pluginregistration_v1_pb2_grpc as rp_grpc
from accel_core.kubeletapi.constants import PLUGIN_TYPE_DRA

HEALTH_MESSAGE_MAX = 1024
#: Claim UID -> (its devices, its error text): a request's answer as the kubelet gets it.
Results = dict[str, tuple[list[PreparedDevice], str]]


class ServedPlugin(Protocol):
    """What the services ask of the plugin behind them."""

    driver: str
    dra_socket: Path

    @property
    def supported_versions(self) -> list[str]: ...

    def prepare_claims_blocking(self, claims: list[ClaimRef]) -> Results: ...

    def unprepare_claims_blocking(self, claims: list[ClaimRef]) -> Results: ...

    def health_updates(self, active: Callable[[], bool]) -> Iterator[Sequence[DeviceHealthReport]]: ...

    def wake_health_streams(self) -> None: ...

    def registration_answered(self, registered: bool, error: str) -> None: ...


def _truncate(message: str) -> str:
    return message if len(message) <= HEALTH_MESSAGE_MAX else message[: HEALTH_MESSAGE_MAX - 3] + "..."


def _prepare_v1(result: Results) -> d1.NodePrepareResourcesResponse:
    resp = d1.NodePrepareResourcesResponse()
    for uid, (devices, error) in result.items():
        entry = resp.claims[uid]
        entry.error = error
        for dev in devices:
            out = entry.devices.add(request_names=list(dev.request_names), pool_name=dev.pool,
                                    device_name=dev.device, cdi_device_ids=list(dev.cdi_device_ids))
            if dev.share_id:
                out.share_id = dev.share_id
    return resp


def _prepare_v1beta1(result: Results) -> d1b.NodePrepareResourcesResponse:
    resp = d1b.NodePrepareResourcesResponse()
    for uid, (devices, error) in result.items():
        entry = resp.claims[uid]
        entry.error = error
        for dev in devices:
            entry.devices.add(request_names=list(dev.request_names), pool_name=dev.pool,
                              device_name=dev.device, cdi_device_ids=list(dev.cdi_device_ids))
    return resp


def _claims(request: Any) -> list[ClaimRef]:
    return [ClaimRef(namespace=c.namespace, uid=c.uid, name=c.name) for c in request.claims]


class DraV1Service(d1_grpc.DRAPluginServicer):
    def __init__(self, plugin: ServedPlugin) -> None:
        self._p = plugin

    def NodePrepareResources(  # noqa: N802
        self, request: d1.NodePrepareResourcesRequest, context: grpc.ServicerContext
    ) -> d1.NodePrepareResourcesResponse:
        return _prepare_v1(self._p.prepare_claims_blocking(_claims(request)))

    def NodeUnprepareResources(  # noqa: N802
        self, request: d1.NodeUnprepareResourcesRequest, context: grpc.ServicerContext
    ) -> d1.NodeUnprepareResourcesResponse:
        result = self._p.unprepare_claims_blocking(_claims(request))
        resp = d1.NodeUnprepareResourcesResponse()
        for uid, (_, error) in result.items():
            resp.claims[uid].error = error
        return resp


class DraV1beta1Service(d1b_grpc.DRAPluginServicer):
    def __init__(self, plugin: ServedPlugin) -> None:
        self._p = plugin

    def NodePrepareResources(  # noqa: N802
        self, request: d1b.NodePrepareResourcesRequest, context: grpc.ServicerContext
    ) -> d1b.NodePrepareResourcesResponse:
        return _prepare_v1beta1(self._p.prepare_claims_blocking(_claims(request)))

    def NodeUnprepareResources(  # noqa: N802
        self, request: d1b.NodeUnprepareResourcesRequest, context: grpc.ServicerContext
    ) -> d1b.NodeUnprepareResourcesResponse:
        result = self._p.unprepare_claims_blocking(_claims(request))
        resp = d1b.NodeUnprepareResourcesResponse()
        for uid, (_, error) in result.items():
            resp.claims[uid].error = error
        return resp


class HealthService(hp_grpc.DRAResourceHealthServicer):
    def __init__(self, plugin: ServedPlugin) -> None:
        self._p = plugin

    def NodeWatchResources(  # noqa: N802
        self, request: hp.NodeWatchResourcesRequest, context: grpc.ServicerContext
    ) -> Iterator[hp.NodeWatchResourcesResponse]:
        context.add_callback(self._p.wake_health_streams)  # a cancelled stream wakes its thread at once
        for reports in self._p.health_updates(context.is_active):
            now = int(time.time())
            msg = hp.NodeWatchResourcesResponse()
            for r in reports:
                status = hp.HEALTHY if r.healthy else (hp.UNKNOWN if r.healthy is None else hp.UNHEALTHY)
                msg.devices.add(device=hp.DeviceIdentifier(pool_name=r.pool, device_name=r.device), health=status,
                                last_updated_time=now, health_check_timeout_seconds=r.timeout_seconds,
                                message=_truncate(r.message))
            yield msg


class RegistrationService(rp_grpc.RegistrationServicer):
    def __init__(self, plugin: ServedPlugin) -> None:
        self._p = plugin

    async def GetInfo(self, request: rp.InfoRequest, context: Ctx) -> rp.PluginInfo:  # noqa: N802
        return rp.PluginInfo(type=PLUGIN_TYPE_DRA, name=self._p.driver, endpoint=str(self._p.dra_socket),
                             supported_versions=self._p.supported_versions)

    async def NotifyRegistrationStatus(  # noqa: N802
        self, request: rp.RegistrationStatus, context: Ctx
    ) -> rp.RegistrationStatusResponse:
        self._p.registration_answered(request.plugin_registered, request.error)
        return rp.RegistrationStatusResponse()
