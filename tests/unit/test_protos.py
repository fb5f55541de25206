"""The kubelet API protos are wire-exact and the committed generated code is current.

The descriptors of our generated modules are compared with the upstream k8s.io/kubelet .proto files of the
Kubernetes release the project builds (package, messages, field names, numbers, types and labels, enums, services and
streaming flags), so any drift in ``protos/`` fails here.
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import grpc
import pytest
from google.protobuf import descriptor_pb2
from grpc_tools import protoc

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

REPO_ROOT = Path(__file__).resolve().parents[2]

# ---------------------------------------------------------------------------
# The upstream .proto files: k8s.io/kubelet at the staging tag of the Kubernetes release scripts/build-kube.sh builds
# (the Go module cache holds them after that script ran; `go mod download` fetches them otherwise).
# ---------------------------------------------------------------------------

UPSTREAM_FILES = {
    "deviceplugin_v1beta1": "pkg/apis/deviceplugin/v1beta1/api.proto",
    "dra_v1": "pkg/apis/dra/v1/api.proto",
    "dra_v1beta1": "pkg/apis/dra/v1beta1/api.proto",
    "dra_health_v1alpha1": "pkg/apis/dra-health/v1alpha1/api.proto",
    "pluginregistration_v1": "pkg/apis/pluginregistration/v1/api.proto",
    "podresources_v1": "pkg/apis/podresources/v1/api.proto",
}
STEMS = sorted(UPSTREAM_FILES)
Upstream = dict[str, descriptor_pb2.FileDescriptorProto]


def _kubelet_module_version() -> str:
    """v1.37.2 (the release build-kube.sh builds) -> v0.37.2 (the tag of its staging module k8s.io/kubelet)."""
    script = (REPO_ROOT / "scripts" / "build-kube.sh").read_text()
    match = re.search(r"^KUBE_VERSION=\$\{KUBE_VERSION:-v1\.(\d+\.\d+)\}", script, re.MULTILINE)
    assert match, "scripts/build-kube.sh no longer sets KUBE_VERSION the way this test reads it"
    return f"v0.{match.group(1)}"


@pytest.fixture(scope="module")
def upstream_dir() -> Path:
    go = shutil.which("go")
    if go is None:
        pytest.fail("Go is needed to find the upstream kubelet .proto files (run scripts/build-kube.sh first)")
    module = f"k8s.io/kubelet@{_kubelet_module_version()}"
    done = subprocess.run([go, "mod", "download", "-json", module], capture_output=True, text=True, timeout=300,
                          cwd=tempfile.gettempdir())
    assert done.returncode == 0, f"go mod download {module}: {done.stdout}{done.stderr}"
    return Path(json.loads(done.stdout)["Dir"])


@pytest.fixture(scope="module")
def upstream(upstream_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Upstream:
    """Each upstream file compiled by protoc (grpcio-tools) into a descriptor."""
    out: dict[str, descriptor_pb2.FileDescriptorProto] = {}
    work = tmp_path_factory.mktemp("upstream-protos")
    for stem, rel in UPSTREAM_FILES.items():
        source = upstream_dir / rel
        assert source.is_file(), f"{source} is missing from the upstream module"
        target = work / f"{stem}.pb"
        rc = protoc.main(["protoc", f"-I{source.parent}", f"--descriptor_set_out={target}", source.name])
        assert rc == 0, f"protoc failed on {source}"
        (out[stem],) = descriptor_pb2.FileDescriptorSet.FromString(target.read_bytes()).file
    return out


def _file_proto(stem: str) -> descriptor_pb2.FileDescriptorProto:
    proto = descriptor_pb2.FileDescriptorProto()
    getattr(kubeletapi, f"{stem}_pb2").DESCRIPTOR.CopyToProto(proto)
    return proto


def _pb2_grpc(stem: str) -> ModuleType:
    module: ModuleType = getattr(kubeletapi, f"{stem}_pb2_grpc")
    return module


def _message(m: descriptor_pb2.DescriptorProto) -> dict[str, Any]:
    F = descriptor_pb2.FieldDescriptorProto
    return {
        "fields": {f.name: {"number": f.number, "type": F.Type.Name(f.type), "label": F.Label.Name(f.label),
                            "type_name": f.type_name, "proto3_optional": f.proto3_optional,
                            "oneof": m.oneof_decl[f.oneof_index].name if f.HasField("oneof_index") else None}
                   for f in m.field},
        "nested": {n.name: _message(n) for n in m.nested_type},
        "enums": {e.name: {v.name: v.number for v in e.value} for e in m.enum_type},
        "map_entry": m.options.map_entry,
    }


def _wire_facts(proto: descriptor_pb2.FileDescriptorProto) -> dict[str, Any]:
    """Everything that reaches the wire or a method path: names, numbers, types, labels, services; not comments."""
    return {
        "syntax": proto.syntax,
        "package": proto.package,
        "imports": list(proto.dependency),
        "messages": {m.name: _message(m) for m in proto.message_type},
        "enums": {e.name: {v.name: v.number for v in e.value} for e in proto.enum_type},
        "services": {s.name: {m.name: (m.input_type, m.output_type, m.client_streaming, m.server_streaming)
                              for m in s.method} for s in proto.service},
    }


class _RecordingChannel:
    """Stands in for grpc.Channel and records which callables a stub creates."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, bool]] = []

    def _record(self, streaming: bool) -> Callable[..., object]:
        def factory(path: str, *args: object, **kwargs: object) -> object:
            self.calls.append((path, streaming))
            return object()

        return factory

    def __getattr__(self, name: str) -> Callable[..., object]:
        kinds = {"unary_unary": False, "unary_stream": True}
        if name not in kinds:
            raise AttributeError(f"stub used unexpected channel method {name}")
        return self._record(kinds[name])


class _RecordingServer:
    """Stands in for grpc.Server and records the method handlers registered on it."""

    def __init__(self) -> None:
        self.methods: list[tuple[str, bool]] = []

    def add_generic_rpc_handlers(self, handlers: object) -> None:
        pass

    def add_registered_method_handlers(self, service: str, handlers: dict[str, Any]) -> None:
        for name, handler in handlers.items():
            self.methods.append((f"/{service}/{name}", bool(handler.response_streaming)))


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


# ---------------------------------------------------------------------------
# Wire exactness: our descriptors against upstream's
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("stem", STEMS)
def test_descriptors_match_upstream_kubelet_protos(
    stem: str, upstream: Upstream
) -> None:
    ours, theirs = _wire_facts(_file_proto(stem)), _wire_facts(upstream[stem])
    for part in theirs:
        assert ours[part] == theirs[part], f"{stem}: {part} differs from k8s.io/kubelet/{UPSTREAM_FILES[stem]}"


def test_the_comparison_sees_a_changed_field_number(upstream: Upstream) -> None:
    """A one-number drift is a difference (the comparison is not vacuous)."""
    edited = descriptor_pb2.FileDescriptorProto()
    edited.CopyFrom(upstream["dra_v1"])
    edited.message_type[0].field[0].number += 1
    assert _wire_facts(edited) != _wire_facts(upstream["dra_v1"])


@pytest.mark.parametrize("stem", STEMS)
def test_generated_stubs_and_servicers_use_upstream_paths(
    stem: str, upstream: Upstream
) -> None:
    theirs = upstream[stem]
    expected = [(f"/{theirs.package}.{s.name}/{m.name}", m.server_streaming) for s in theirs.service for m in s.method]
    module = _pb2_grpc(stem)
    channel = _RecordingChannel()
    server = _RecordingServer()
    for service in theirs.service:
        getattr(module, f"{service.name}Stub")(channel)
        servicer = getattr(module, f"{service.name}Servicer")()
        getattr(module, f"add_{service.name}Servicer_to_server")(servicer, server)
    assert channel.calls == expected
    assert server.methods == expected


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
