"""The committed generated kubelet API code is current (scripts/gen_protos.py) and its messages behave on the wire:
field presence, maps, known bytes, constants and a round trip over a unix socket. That the descriptors are wire-exact
against upstream's .proto files is tests/e2e/gotools/test_protos_upstream.py (it needs Go to fetch them).
"""

from __future__ import annotations

import asyncio
import importlib.util
import shutil
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import grpc
import pytest

from accel_core import kubeletapi
from accel_core.kubeletapi import (
    deviceplugin_v1beta1_pb2 as dp_pb2,
)
from accel_core.kubeletapi import (
    deviceplugin_v1beta1_pb2_grpc as dp_grpc,
)
from accel_core.kubeletapi import (
    dra_health_v1alpha1_pb2 as health_pb2,
)
from accel_core.kubeletapi import (
    dra_v1_pb2,
    dra_v1beta1_pb2,
    podresources_v1_pb2,
)

REPO_ROOT = Path(__file__).resolve().parents[3]

#: The generated gRPC modules, one per kubelet API .proto.
STEMS = sorted(p.name.removesuffix("_pb2_grpc.py") for p in Path(kubeletapi.__file__).parent.glob("*_pb2_grpc.py"))


def _pb2_grpc(stem: str) -> ModuleType:
    module: ModuleType = getattr(kubeletapi, f"{stem}_pb2_grpc")
    return module


# ---------------------------------------------------------------------------
# Generated code is current
# ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def gen_protos() -> Iterator[ModuleType]:
    """Load scripts/gen_protos.py as a module (scripts/ is not a package)."""
    spec = importlib.util.spec_from_file_location("gen_protos", REPO_ROOT / "scripts" / "gen_protos.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["gen_protos"] = module
    spec.loader.exec_module(module)
    yield module
    sys.modules.pop("gen_protos", None)


def test_committed_generated_code_matches_script(gen_protos: ModuleType) -> None:
    assert gen_protos.check() == []


def test_check_reports_edited_missing_and_stale_files(gen_protos: ModuleType, tmp_path: Path) -> None:
    committed = REPO_ROOT / "accel_core" / "kubeletapi"
    copy = tmp_path / "kubeletapi"
    shutil.copytree(committed, copy)
    edited = copy / "dra_v1_pb2.py"
    edited.write_text(edited.read_text(encoding="utf-8") + "# edited\n", encoding="utf-8")
    (copy / "podresources_v1_pb2.pyi").unlink()
    (copy / "old_api_pb2.py").write_text("", encoding="utf-8")

    problems = gen_protos.check(output_dir=copy)

    assert any(p.startswith("differs: dra_v1_pb2.py") for p in problems)
    assert "missing: podresources_v1_pb2.pyi" in problems
    assert "stale (no longer generated): old_api_pb2.py" in problems
    assert len(problems) == 3


def test_generated_grpc_modules_import_siblings_relatively() -> None:
    for stem in STEMS:
        source = Path(_pb2_grpc(stem).__file__ or "").read_text(encoding="utf-8")
        assert f"from . import {stem}_pb2 as " in source
        assert f"\nimport {stem}_pb2" not in source


def test_relativize_imports_only_touches_local_modules(gen_protos: ModuleType) -> None:
    source = "import grpc\nimport a_pb2 as a__pb2\nfrom b_pb2 import X\nimport other_pb2 as o\n"
    fixed = gen_protos.relativize_imports(source, {"a_pb2", "b_pb2"})
    assert fixed == "import grpc\nfrom . import a_pb2 as a__pb2\nfrom .b_pb2 import X\nimport other_pb2 as o\n"


V1_ONLY_FIELDS: dict[str, Any] = {"share_id": "x"}


def test_share_id_has_presence_in_dra_v1_only() -> None:
    v1_field = dra_v1_pb2.Device.DESCRIPTOR.fields_by_name["share_id"]
    assert v1_field.has_presence
    device = dra_v1_pb2.Device()
    assert not device.HasField("share_id")
    device.share_id = ""
    assert device.HasField("share_id")
    assert device.SerializeToString() == b"\x2a\x00"  # field 5, length-delimited, empty

    assert "share_id" not in dra_v1beta1_pb2.Device.DESCRIPTOR.fields_by_name
    with pytest.raises(ValueError, match="share_id"):
        dra_v1beta1_pb2.Device(**V1_ONLY_FIELDS)

    assert podresources_v1_pb2.ClaimResource.DESCRIPTOR.fields_by_name["share_id"].has_presence


def test_map_fields_behave_as_maps() -> None:
    response = dp_pb2.ContainerAllocateResponse(envs={"A": "1"}, annotations={"k": "v"})
    assert dict(response.envs) == {"A": "1"}
    assert dict(response.annotations) == {"k": "v"}
    for name in ("envs", "annotations"):
        entry = dp_pb2.ContainerAllocateResponse.DESCRIPTOR.fields_by_name[name].message_type
        assert entry is not None and entry.GetOptions().map_entry
    for module in (dra_v1_pb2, dra_v1beta1_pb2):
        prepared = module.NodePrepareResourcesResponse()
        prepared.claims["uid-1"].error = "boom"
        assert prepared.claims["uid-1"].error == "boom"
        unprepared = module.NodeUnprepareResourcesResponse()
        unprepared.claims["uid-2"].error = ""
        assert list(unprepared.claims) == ["uid-2"]


def test_known_wire_bytes() -> None:
    device = dp_pb2.Device(ID="a", health=kubeletapi.HEALTHY)
    assert device.SerializeToString() == b"\x0a\x01a\x12\x07Healthy"
    assert dp_pb2.NUMANode(ID=1).SerializeToString() == b"\x08\x01"
    health = health_pb2.DeviceHealth(health=health_pb2.UNHEALTHY, health_check_timeout_seconds=30, message="x")
    assert health.SerializeToString() == b"\x10\x02\x20\x1e\x2a\x01x"
    request = dp_pb2.RegisterRequest(version=kubeletapi.DEVICE_PLUGIN_VERSION, endpoint="e.sock")
    assert request.SerializeToString() == b"\x0a\x07v1beta1\x12\x06e.sock"


def test_constants() -> None:
    assert kubeletapi.DEVICE_PLUGIN_VERSION == "v1beta1"
    assert kubeletapi.DRA_V1_SERVICE == "v1.DRAPlugin"
    assert kubeletapi.DRA_V1BETA1_SERVICE == "v1beta1.DRAPlugin"
    assert kubeletapi.DRA_HEALTH_V1ALPHA1_SERVICE == "v1alpha1.DRAResourceHealth"
    assert kubeletapi.PLUGIN_TYPE_DRA == "DRAPlugin"
    assert (kubeletapi.HEALTHY, kubeletapi.UNHEALTHY) == ("Healthy", "Unhealthy")
    # The advertised version strings are "<last package segment>.<Service>".
    for module, constant in (
        (dra_v1_pb2, kubeletapi.DRA_V1_SERVICE),
        (dra_v1beta1_pb2, kubeletapi.DRA_V1BETA1_SERVICE),
        (health_pb2, kubeletapi.DRA_HEALTH_V1ALPHA1_SERVICE),
    ):
        (service,) = module.DESCRIPTOR.services_by_name.values()
        assert f"{service.full_name.rsplit('.', 2)[-2]}.{service.name}" == constant


# ---------------------------------------------------------------------------
# Round trip over a real unix socket
# ---------------------------------------------------------------------------


# The generated *_pb2_grpc modules are untyped; bind what the test calls to typed names.
_add_device_plugin: Callable[[dp_grpc.DevicePluginServicer, grpc.aio.Server], None] = (
    dp_grpc.add_DevicePluginServicer_to_server
)
_DevicePluginStub: Callable[[grpc.aio.Channel], Any] = dp_grpc.DevicePluginStub


class _Plugin(dp_grpc.DevicePluginServicer):
    async def GetDevicePluginOptions(  # noqa: N802 - gRPC method name
        self, request: dp_pb2.Empty, context: grpc.aio.ServicerContext[Any, Any]
    ) -> dp_pb2.DevicePluginOptions:
        return dp_pb2.DevicePluginOptions(pre_start_required=False, get_preferred_allocation_available=True)


async def _round_trip(socket_path: Path) -> tuple[dp_pb2.DevicePluginOptions, grpc.StatusCode]:
    server = grpc.aio.server()
    _add_device_plugin(_Plugin(), server)
    server.add_insecure_port(f"unix://{socket_path}")
    await server.start()
    try:
        async with grpc.aio.insecure_channel(f"unix://{socket_path}") as channel:
            stub = _DevicePluginStub(channel)
            options = await stub.GetDevicePluginOptions(dp_pb2.Empty(), timeout=10)
            with pytest.raises(grpc.aio.AioRpcError) as unimplemented:
                await stub.Allocate(dp_pb2.AllocateRequest(), timeout=10)
            return options, unimplemented.value.code()
    finally:
        await server.stop(None)


def test_device_plugin_round_trip_over_unix_socket(tmp_path: Path) -> None:
    socket_path = tmp_path / "dp.sock"
    options, allocate_code = asyncio.run(_round_trip(socket_path))
    assert options.get_preferred_allocation_available is True
    assert options.pre_start_required is False
    assert allocate_code == grpc.StatusCode.UNIMPLEMENTED
