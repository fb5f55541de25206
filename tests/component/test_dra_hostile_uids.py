"""Claim UIDs that are no Kubernetes UID, through the DRA gRPC services as the kubelet calls them (both versions),
with the real core driver (EFA profile, p5 fake host) behind the plugin: an unprepare is a success that touches
nothing (before round 3 a 300 or 100,000 character UID failed with "file name too long", and the kubelet retries a
failed unprepare forever); a prepare fails that claim in one short line; the real claim beside them is unaffected."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import Any

import msgspec
import pytest
from accel_rig.kubelet_standin import KubeletStandIn
from hostcache import shared_host
from lightkube.resources.resource_v1 import ResourceClaim

from accel_core.dra.cdi import CdiSpecWriter
from accel_core.dra.pluginserver import DraPlugin
from accel_core.dra.preparation import CDI_CLASS, DraDriver, cdi_vendor
from accel_core.dra.store import ClaimStore
from efa_plugin.dra.profile import EfaProfile

DRIVER = "efa.aws.com"
NODE = "node-a"


class Reader:
    def __init__(self, claims: dict[tuple[str, str], dict[str, Any]]) -> None:
        self.claims = claims

    async def read(self, namespace: str, name: str) -> ResourceClaim | None:
        return self.read_blocking(namespace, name)

    def read_blocking(self, namespace: str, name: str) -> ResourceClaim | None:
        found = self.claims.get((namespace, name))
        return None if found is None else msgspec.convert(found, ResourceClaim)


@pytest.mark.parametrize("version", ["v1.DRAPlugin", "v1beta1.DRAPlugin"])
def test_hostile_uids_over_grpc(short_tmp: Path, version: str, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO)
    standin = KubeletStandIn(short_tmp / "kubelet")
    standin.registry_dir.mkdir(parents=True)
    paths = standin.paths(host_root=shared_host("p5.48xlarge").root, cdi_root=short_tmp / "cdi")
    profile = EfaProfile()
    scan = profile.scan(paths, "1.0.0")
    device = scan.devices[0].name
    results = [{"request": "nic", "driver": DRIVER, "pool": NODE, "device": device}]
    reader = Reader({("ns", "good"): {"metadata": {"namespace": "ns", "name": "good", "uid": "uid-good"},
                                      "status": {"allocation": {"devices": {"results": results}}}}})
    store = ClaimStore(paths.plugins_data_dir / DRIVER / "checkpoint.json", "boot")
    store.load()
    cdi = CdiSpecWriter(paths.cdi_root, cdi_vendor(DRIVER), CDI_CLASS)
    driver = DraDriver(profile, node_name=NODE, reader=reader, cdi=cdi, store=store, inventory=lambda: scan.inventory)
    hostile = ["a" * 300, "b" * 100_000]

    async def scenario() -> None:
        plugin = DraPlugin(driver, paths, pod_uid="pod-1")
        await plugin.start()
        try:
            conn = await standin.register_dra(DRIVER)
            good = ("ns", "uid-good", "good")
            prepared: Any = await conn.prepare(good, *(("ns", uid, "x") for uid in hostile), version=version)
            assert prepared["uid-good"].error == "" and len(prepared["uid-good"].devices) == 1
            for uid in hostile:
                error = prepared[uid].error
                assert "is not a UID" in error and "\n" not in error and len(error) < 400
            unprepared: Any = await conn.unprepare(*(("ns", uid, "x") for uid in hostile), version=version)
            assert {uid: unprepared[uid].error for uid in hostile} == dict.fromkeys(hostile, "")
            assert store.get("uid-good") is not None and cdi.spec_ids() == ["uid-good"]
            unprepared = await conn.unprepare(good, version=version)
            assert unprepared["uid-good"].error == "" and cdi.spec_ids() == [] and store.claims() == []
            await conn.close()
        finally:
            await plugin.stop()

    asyncio.run(scenario())
    assert all(r.exc_info is None and len(r.getMessage()) < 400 for r in caplog.records)
    assert all(len(str(getattr(r, "claim", ""))) < 400 and len(str(getattr(r, "error", ""))) < 1200
               for r in caplog.records)
