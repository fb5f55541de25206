"""The one DRA test rig: claims as the API server returns them, read and prepared on production's path.

- :func:`claim`: the claim factory, a ResourceClaim body as the API server returns it once allocated;
- :class:`DictClaims`: the blocking claim GET (:class:`accel_core.dra.claims.ClaimGet`) over such bodies, each
  decoded from JSON as the h11 GET decodes it; it records what it was asked;
- :class:`DriverRig`: one profile's driver on a fake host with the plugin in front of it (not served):
  :meth:`DriverRig.prepare` is the DRA server thread's call (:meth:`DraPlugin.prepare`: the plugin reads the claims
  the driver names, then the driver prepares the objects under the locks); :meth:`DriverRig.restart` is a new
  process on the same files;
- :func:`served_paths`: a kubelet stand-in and the paths of a driver it serves;
- :func:`running_service`: a :class:`DraService` built from its collaborators, served until the block ends;
- :func:`configs`: a claim's configs decoded as the driver decodes them.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import msgspec
from accel_rig.kubelet_standin import KubeletStandIn
from lightkube.resources.resource_v1 import ResourceClaim

from accel_core.dra.cdi import CdiSpecWriter
from accel_core.dra.checkpoint import read_boot_id
from accel_core.dra.claimreport import ClaimProblem
from accel_core.dra.claims import ClaimGet, ClaimReader
from accel_core.dra.config import OpaqueEntry, configs_for_requests
from accel_core.dra.daemon import DraService, Publisher, ServiceSettings
from accel_core.dra.kubeletservices import Results
from accel_core.dra.metadata import MetadataFiles
from accel_core.dra.pluginserver import DraPlugin
from accel_core.dra.preparation import CDI_CLASS, DraDriver, cdi_vendor
from accel_core.dra.prepared import PreparedClaim
from accel_core.dra.profile import DraProfile
from accel_core.dra.store import ClaimStore
from accel_core.dra.types import ClaimRef, PreparedDevice
from accel_core.health import HEALTHY
from accel_core.paths import HostPaths

NODE = "node-a"


def claim(name: str, devices: Sequence[str], *, driver: str, uid: str | None = None, namespace: str = "ns",
          pool: str = NODE, request: str = "r", params: Sequence[Mapping[str, Any]] = (),
          configs: Sequence[Mapping[str, Any]] = (), admin: bool = False,
          reserved: Sequence[Mapping[str, str]] | None = None) -> dict[str, Any]:
    """An allocated ResourceClaim (resource.k8s.io/v1) as the API server returns it: ``devices`` of ``driver`` in
    ``pool`` for ``request`` (``request/subrequest`` when a prioritized list chose one; ``admin``: adminAccess), each
    of ``params`` as the opaque parameters of a FromClaim config, then ``configs`` as they are, and ``reserved`` as
    ``reservedFor``. The UID is ``uid-<name>`` unless given."""
    results = [{"request": request, "driver": driver, "pool": pool, "device": d,
                **({"adminAccess": True} if admin else {})} for d in devices]
    config = [{"source": "FromClaim", "opaque": {"driver": driver, "parameters": p}} for p in params] + list(configs)
    status: dict[str, Any] = {"allocation": {"devices": {"results": results, "config": config}}}
    if reserved is not None:
        status["reservedFor"] = list(reserved)
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"namespace": namespace, "name": name, "uid": uid or f"uid-{name}"}, "status": status}


def ref_of(body: Mapping[str, Any]) -> ClaimRef:
    """The kubelet's reference to a claim body."""
    meta = body["metadata"]
    return ClaimRef(meta["namespace"], meta["uid"], meta["name"])


class DictClaims:
    """Claim bodies by (namespace, name), served as the API server would: a blocking GET, decoded from JSON into
    lightkube's ``ResourceClaim`` (a body of the wrong shape fails as production's decode does)."""

    def __init__(self) -> None:
        self.claims: dict[tuple[str, str], dict[str, Any]] = {}
        self.asked: list[tuple[str, str]] = []

    @property
    def reads(self) -> int:
        return len(self.asked)

    def add(self, body: dict[str, Any]) -> ClaimRef:
        ref = ref_of(body)
        self.claims[(ref.namespace, ref.name)] = body
        return ref

    def get(self, namespace: str, name: str) -> ResourceClaim | None:
        self.asked.append((namespace, name))
        found = self.claims.get((namespace, name))
        return None if found is None else msgspec.json.decode(msgspec.json.encode(found), type=ResourceClaim)

    def close(self) -> None:
        pass


class Notices:
    """What the driver's prepares tell (:class:`~accel_core.dra.preparation.PrepareNotices`), kept."""

    def __init__(self) -> None:
        self.claims: list[PreparedClaim] = []  #: newly prepared claims, in order
        self.problems: list[ClaimProblem] = []

    def prepared(self, claims: Sequence[PreparedClaim]) -> None:
        self.claims.extend(claims)

    def failed(self, problems: Sequence[ClaimProblem]) -> None:
        self.problems.extend(problems)


def served_paths(root: Path, host_root: Path | None = None) -> tuple[KubeletStandIn, HostPaths]:
    """A kubelet stand-in at ``root/k`` (its plugin registry made) and the paths of a driver it serves: the host at
    ``host_root`` (default: the stand-in's), CDI specs in ``root/cdi``. ``root`` short: unix socket paths."""
    standin = KubeletStandIn(root / "k")
    standin.registry_dir.mkdir(parents=True, exist_ok=True)
    host = {"host_root": host_root} if host_root is not None else {}
    return standin, standin.paths(cdi_root=root / "cdi", **host)


def host_paths(root: Path, host_root: Path) -> HostPaths:
    """A driver's paths: the host tree, and kubelet and CDI directories of its own under ``root``."""
    return HostPaths(host_root=host_root, kubelet_root=root / "kubelet", cdi_root=root / "cdi",
                     device_plugins=root / "kubelet" / "device-plugins")


class DriverRig:
    """``profile``'s driver on ``paths`` (a fake host shared read-only, or a copy the test changes), the plugin in
    front of it and a :class:`DictClaims` behind (or ``api``, such as the h11 GET of a stand-in server).
    ``blocked``: the driver's guard; ``pod_uid``: the plugin's (a rolling update's file lock)."""

    def __init__(self, paths: HostPaths, profile: DraProfile[Any, Any], *, api: ClaimGet | None = None,
                 blocked: Callable[[], str | None] | None = None, pod_uid: str | None = None,
                 metadata: bool = False) -> None:
        self.paths = paths
        self.profile = profile
        self.driver_name = profile.driver_name
        self.claims = DictClaims()
        self.api: ClaimGet = api if api is not None else self.claims
        self.notices = Notices()
        self.blocked = blocked
        self.pod_uid = pod_uid
        self.metadata = metadata
        self._scan()
        self.restart()

    @property
    def checkpoint(self) -> Path:
        return self.paths.plugins_data_dir / self.driver_name / "checkpoint.json"

    def rescan(self) -> None:
        """Scan the host again (after a test changed it) and hand the driver what it found, as the service does."""
        self._scan()
        self.driver.set_inventory(self.inventory)
        self.driver.set_published(self.scan.devices)
        self.driver.set_health(self._health())

    def _scan(self) -> None:
        self.scan = self.profile.scan(self.paths, "1.0.0")
        self.inventory = self.scan.inventory
        self.devices = [d.name for d in self.scan.devices]

    def restart(self) -> None:
        """A new process on the same files: checkpoint loaded, lost specs restored, orphans removed (as at start)."""
        self.store = ClaimStore(self.checkpoint, read_boot_id(self.paths.host_root))
        self.loaded = self.store.load()
        self.cdi = CdiSpecWriter(self.paths.cdi_root, cdi_vendor(self.driver_name), CDI_CLASS)
        self.driver = DraDriver(self.profile, node_name=NODE, cdi=self.cdi, store=self.store,
                                inventory=self.inventory, blocked=self.blocked,
                                notices=self.notices, metadata=MetadataFiles(self.driver_name, self.checkpoint.parent)
                                if self.metadata else None)
        self.driver.set_published(self.scan.devices)
        self.reader = ClaimReader(self.api, self.driver.metrics)
        self.plugin = DraPlugin(self.driver, self.paths, claims=self.reader, pod_uid=self.pod_uid)
        self.restored = self.driver.restore()
        self.orphans = self.driver.remove_orphan_specs()
        self.driver.set_health(self._health())

    def _health(self) -> dict[str, Any]:
        return {d.name: self.scan.health.get(d.name, HEALTHY) for d in self.scan.devices}

    def add(self, name: str, devices: Sequence[str], **kwargs: Any) -> ClaimRef:
        """A claim of this driver (:func:`claim`) for the API server to return; its reference."""
        return self.claims.add(claim(name, devices, **{"driver": self.driver_name, **kwargs}))

    def prepare(self, *refs: ClaimRef) -> Mapping[str, Any]:
        """One prepare request as the DRA server thread makes it: each UID's devices or exception."""
        return self.plugin.prepare(refs)[0]

    def prepare_one(self, ref: ClaimRef) -> list[PreparedDevice]:
        """A request of one claim: its devices, or its exception raised."""
        result = self.prepare(ref)[ref.uid]
        if isinstance(result, BaseException):
            raise result
        return list(result)

    def unprepare(self, *refs: ClaimRef) -> Mapping[str, Any]:
        """One unprepare request as the DRA server thread makes it: each UID's None or exception."""
        return self.plugin.unprepare(refs)[0]

    def unprepare_one(self, ref: ClaimRef) -> None:
        """An unprepare request of one claim; its exception raised."""
        error = self.unprepare(ref)[ref.uid]
        if error is not None:
            raise error

    def answer(self, *refs: ClaimRef) -> Results:
        """A prepare request's answer as the kubelet gets it: each UID's (devices, error text)."""
        return self.plugin.prepare_claims_blocking(list(refs))

    def unanswer(self, *refs: ClaimRef) -> Results:
        """An unprepare request's answer as the kubelet gets it."""
        return self.plugin.unprepare_claims_blocking(list(refs))


@contextlib.asynccontextmanager
async def running_service(profile: DraProfile[Any, Any], paths: HostPaths, *, claims: DictClaims | None = None,
                          publisher: Publisher | None = None, **settings: Any) -> AsyncIterator[DraService]:
    """A DraService on ``paths`` (no API server: claims from ``claims``, slices to ``publisher``), run until the
    block ends; ``settings``: :class:`ServiceSettings` fields besides the node name."""
    service = DraService(profile, paths, ServiceSettings(node_name=NODE, **settings), claims=claims,
                         publisher=publisher)
    stop = asyncio.Event()
    task = asyncio.create_task(service.run(stop))
    try:
        await asyncio.wait_for(service.ready.wait(), 10)
        yield service
    finally:
        stop.set()
        await asyncio.wait_for(task, 10)


def configs(profile: DraProfile[Any, Any], entries: Sequence[OpaqueEntry], requests: Sequence[str]) -> dict[str, Any]:
    """Each request's effective config as the driver decodes a claim's: the core's precedence, the profile's decoder."""
    return configs_for_requests(entries, requests, driver=profile.driver_name, decode=profile.decode_config,
                                default=profile.default_config)
