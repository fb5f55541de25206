"""Queues and logs of the DRA core under a hostile or overloaded peer: the registration answers a kubelet keeps
sending are kept bounded and cut, long text is cut in log lines, and a warning that fires per claim is rate-limited
with a count of what was held back."""

from __future__ import annotations

import asyncio
import logging
import tracemalloc
from collections.abc import Sequence
from pathlib import Path

import grpc
import pytest
from drarig import served_paths

from accel_core.dra.logtext import LOG_TEXT_MAX, Throttle, cut
from accel_core.dra.pluginserver import REGISTRATION_STATUS_KEPT, DraPlugin
from accel_core.dra.prepared import PreparedClaim
from accel_core.dra.status import MAX_PENDING, DeviceStatusWriter
from accel_core.dra.types import ClaimRef, DeviceHealthReport, DeviceStatusData, PreparedDevice
from accel_core.kubeletapi import pluginregistration_v1_pb2 as rp
from accel_core.kubeletapi import pluginregistration_v1_pb2_grpc as rp_grpc

MIB = 1024 * 1024


class IdleHandler:
    driver_name = "toy.example.com"

    def claims_to_read(self, claims: Sequence[ClaimRef], *, locked: bool = False) -> list[ClaimRef]:
        return []

    def read_all(self, claims: Sequence[ClaimRef]) -> dict[str, None]:
        return {}

    def prepare_blocking(self, claims: Sequence[ClaimRef], reads: object
                         ) -> dict[str, list[PreparedDevice] | Exception]:
        return {c.uid: [] for c in claims}

    def unprepare_blocking(self, claims: Sequence[ClaimRef]) -> dict[str, Exception | None]:
        return {c.uid: None for c in claims}

    def health(self) -> list[DeviceHealthReport] | None:
        return []


def test_cut_says_how_much_was_left_out() -> None:
    assert cut("short") == "short"
    assert cut("x" * LOG_TEXT_MAX) == "x" * LOG_TEXT_MAX
    assert cut("x" * (LOG_TEXT_MAX + 7)) == "x" * LOG_TEXT_MAX + "... (7 more characters)"
    assert cut(ValueError("y" * MIB), 10) == "y" * 10 + f"... ({MIB - 10} more characters)"


def test_throttle_logs_once_per_period_then_counts(caplog: pytest.LogCaptureFixture) -> None:
    now = [0.0]
    throttle = Throttle(logging.getLogger("t"), period=10.0, clock=lambda: now[0])
    caplog.set_level(logging.WARNING, "t")
    assert throttle.warning("queue full")
    assert not any(throttle.warning("queue full") for _ in range(5))
    now[0] = 10.0
    assert throttle.warning("queue full")
    assert throttle.warning("another")  # its own key
    assert [r.getMessage() for r in caplog.records] == ["queue full", "queue full ... (5 more since)", "another"]


def test_two_hundred_rejections_with_one_mib_errors_keep_little_and_log_short_lines(
        short_tmp: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, "accel_core.dra.pluginserver")

    async def scenario() -> tuple[int, list[tuple[bool, str]]]:
        standin, paths = served_paths(short_tmp)
        handler = IdleHandler()
        plugin = DraPlugin(handler, paths, claims=handler, pod_uid="pod-1")
        await plugin.start()
        try:
            options = [("grpc.max_send_message_length", 4 * MIB)]
            async with grpc.aio.insecure_channel(f"unix://{plugin.registration_socket}", options=options) as ch:
                stub = rp_grpc.RegistrationStub(ch)
                tracemalloc.start()
                before = tracemalloc.get_traced_memory()[0]
                for i in range(200):
                    error = f"{i}:" + "e" * MIB
                    await stub.NotifyRegistrationStatus(rp.RegistrationStatus(plugin_registered=False, error=error))
                grown = tracemalloc.get_traced_memory()[0] - before
                tracemalloc.stop()
            kept = []
            while not plugin.registration_status.empty():
                kept.append(plugin.registration_status.get_nowait())
            return grown, kept
        finally:
            await plugin.stop()

    grown, kept = asyncio.run(scenario())
    assert grown < 8 * MIB, f"200 rejections of 1 MiB kept {grown / MIB:.0f} MiB"
    assert len(kept) == REGISTRATION_STATUS_KEPT
    assert kept[-1][1].startswith("199:") and all(not ok for ok, _ in kept)  # the newest are kept
    assert all(error.endswith(f"... ({MIB + 4 - LOG_TEXT_MAX} more characters)") for _, error in kept)
    lines = [r for r in caplog.records if "REJECTED" in r.getMessage()]
    assert len(lines) == 1  # the first; the rest within the period are counted for the next line
    assert all(len(str(getattr(r, "error", ""))) < 2 * LOG_TEXT_MAX for r in lines)


def test_a_full_status_queue_warns_once_with_a_count(monkeypatch: pytest.MonkeyPatch,
                                                     caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, "accel_core.dra.status")
    claims = [PreparedClaim(f"uid-{i}", "ns", f"c{i}", "node-a", (),
                            status=(("dev-0", DeviceStatusData({"index": 0})),)) for i in range(MAX_PENDING + 4500)]

    async def scenario() -> DeviceStatusWriter:
        writer = DeviceStatusWriter(None, "toy.example.com", delay=3600)  # type: ignore[arg-type]
        writer._loop = asyncio.get_running_loop()
        for start in range(0, len(claims), 500):  # as prepares hand them over, a request at a time
            writer._put(claims[start:start + 500])
        return writer

    writer = asyncio.run(scenario())
    assert writer.dropped == 4500
    lines = [r.getMessage() for r in caplog.records]
    assert lines == ["too many device status writes pending; dropping them"], lines
