"""Claim UIDs that are no Kubernetes UID, through the DRA gRPC services as the kubelet calls them (both versions),
with the real core driver (EFA profile, p5 fake host) behind the plugin: an unprepare is a success that touches
nothing (before round 3 a 300 or 100,000 character UID failed with "file name too long", and the kubelet retries a
failed unprepare forever); a prepare fails that claim in one short line; the real claim beside them is unaffected."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import Any

import pytest
from drarig import DriverRig, served_paths
from hostcache import shared_host

from efa_plugin.dra.profile import EfaProfile

DRIVER = "efa.aws.com"
NODE = "node-a"


@pytest.mark.parametrize("version", ["v1.DRAPlugin", "v1beta1.DRAPlugin"])
def test_hostile_uids_over_grpc(short_tmp: Path, version: str, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO)
    standin, paths = served_paths(short_tmp, shared_host("p5.48xlarge").root)
    rig = DriverRig(paths, EfaProfile(), pod_uid="pod-1")
    rig.add("good", rig.devices[:1], request="nic")
    store, cdi, plugin = rig.store, rig.cdi, rig.plugin
    hostile = ["a" * 300, "b" * 100_000]

    async def scenario() -> None:
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
