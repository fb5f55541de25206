"""Issue 25 item 3, as properties: whatever a caller sends, the policy gets only what the node has."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from accel_core.deviceplugin import AdvertisedDevice, AllocationError, DevicePluginServer
from accel_core.edits import ContainerEdits
from accel_core.kubeletapi import deviceplugin_v1beta1_pb2 as pb
from accel_core.paths import HostPaths

DEVICES = 8
KNOWN = [f"d{i}" for i in range(DEVICES)]


class Fixed:
    resource_name = "example.com/thing"
    socket_name = "thing.sock"

    def devices(self) -> Sequence[AdvertisedDevice]:
        return [AdvertisedDevice(i) for i in KNOWN]

    def advertise_blocked(self) -> str | None:
        return None

    def preferred(self, available: Sequence[str], must_include: Sequence[str], size: int) -> list[str]:
        raise AssertionError("not called here")

    def allocate(self, ids: Sequence[str]) -> ContainerEdits:
        raise AssertionError("not called here")


def _server() -> DevicePluginServer:
    async def build() -> DevicePluginServer:
        server = DevicePluginServer(Fixed(), HostPaths(kubelet_root=Path("/nonexistent")))
        await server.refresh()
        return server
    return asyncio.run(build())


SERVER = _server()
ids = st.lists(st.sampled_from(KNOWN) | st.text(max_size=70), max_size=3 * DEVICES)


@settings(max_examples=300, deadline=None)
@given(available=ids, must=ids, size=st.integers(-(2**31), 2**31 - 1))
def test_preferred_request_is_bounded_or_refused(available: list[str], must: list[str], size: int) -> None:
    creq = pb.ContainerPreferredAllocationRequest(available_deviceIDs=available, must_include_deviceIDs=must,
                                                  allocation_size=size)
    try:
        got_available, got_must, got_size = SERVER.bounded_preferred_request(3, creq)
    except AllocationError as exc:
        assert str(exc).startswith("GetPreferredAllocation container request 3:")
        assert len(str(exc)) < 300, "one short line, whatever the IDs"
        bad_must = [m for m in must if m not in KNOWN]
        assert not (0 <= size <= DEVICES) or len(available) > DEVICES or len(must) > DEVICES or bad_must
        return
    assert 0 <= got_size <= DEVICES
    assert set(got_available) <= set(KNOWN) and len(got_available) <= DEVICES
    assert set(got_must) == set(must) <= set(KNOWN) and len(got_must) <= DEVICES
    assert got_available == [a for a in available if a in KNOWN]
