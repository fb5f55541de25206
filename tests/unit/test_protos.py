"""The kubelet API protos are wire-exact and the committed generated code is current.

The tables below restate the kubelet's published API (packages, services, RPCs,
streaming flags, messages and fields) and are compared with the descriptors of
the generated modules, so any drift in ``protos/`` fails here.
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
from google.protobuf import descriptor_pb2

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
# Expected API tables
# ---------------------------------------------------------------------------

S, OPT, R = "singular", "optional", "repeated"  # implicit presence, proto3 optional, repeated
DRA1 = "k8s.io.kubelet.pkg.apis.dra.v1"
DRA1B1 = "k8s.io.kubelet.pkg.apis.dra.v1beta1"

FieldRow = tuple[str, int, str, str]  # (field, number, type, label)
MethodRow = tuple[str, str, str, bool]  # (full method path, request, response, server streaming)

DEVICEPLUGIN_MESSAGES: dict[str, list[FieldRow]] = {
    "v1beta1.DevicePluginOptions": [
        ("pre_start_required", 1, "bool", S),
        ("get_preferred_allocation_available", 2, "bool", S),
    ],
    "v1beta1.RegisterRequest": [
        ("version", 1, "string", S),
        ("endpoint", 2, "string", S),
        ("resource_name", 3, "string", S),
        ("options", 4, "v1beta1.DevicePluginOptions", S),
    ],
    "v1beta1.Empty": [],
    "v1beta1.ListAndWatchResponse": [("devices", 1, "v1beta1.Device", R)],
    "v1beta1.TopologyInfo": [("nodes", 1, "v1beta1.NUMANode", R)],
    "v1beta1.NUMANode": [("ID", 1, "int64", S)],
    "v1beta1.Device": [
        ("ID", 1, "string", S),
        ("health", 2, "string", S),
        ("topology", 3, "v1beta1.TopologyInfo", S),
    ],
    "v1beta1.PreStartContainerRequest": [("devices_ids", 1, "string", R)],
    "v1beta1.PreStartContainerResponse": [],
    "v1beta1.PreferredAllocationRequest": [
        ("container_requests", 1, "v1beta1.ContainerPreferredAllocationRequest", R),
    ],
    "v1beta1.ContainerPreferredAllocationRequest": [
        ("available_deviceIDs", 1, "string", R),
        ("must_include_deviceIDs", 2, "string", R),
        ("allocation_size", 3, "int32", S),
    ],
    "v1beta1.PreferredAllocationResponse": [
        ("container_responses", 1, "v1beta1.ContainerPreferredAllocationResponse", R),
    ],
    "v1beta1.ContainerPreferredAllocationResponse": [("deviceIDs", 1, "string", R)],
    "v1beta1.AllocateRequest": [("container_requests", 1, "v1beta1.ContainerAllocateRequest", R)],
    "v1beta1.ContainerAllocateRequest": [("devices_ids", 1, "string", R)],
    "v1beta1.CDIDevice": [("name", 1, "string", S)],
    "v1beta1.AllocateResponse": [("container_responses", 1, "v1beta1.ContainerAllocateResponse", R)],
    "v1beta1.ContainerAllocateResponse": [
        ("envs", 1, "map<string,string>", R),
        ("mounts", 2, "v1beta1.Mount", R),
        ("devices", 3, "v1beta1.DeviceSpec", R),
        ("annotations", 4, "map<string,string>", R),
        ("cdi_devices", 5, "v1beta1.CDIDevice", R),
    ],
    "v1beta1.Mount": [
        ("container_path", 1, "string", S),
        ("host_path", 2, "string", S),
        ("read_only", 3, "bool", S),
    ],
    "v1beta1.DeviceSpec": [
        ("container_path", 1, "string", S),
        ("host_path", 2, "string", S),
        ("permissions", 3, "string", S),
    ],
}

DEVICEPLUGIN_METHODS: list[MethodRow] = [
    ("/v1beta1.Registration/Register", "v1beta1.RegisterRequest", "v1beta1.Empty", False),
    ("/v1beta1.DevicePlugin/GetDevicePluginOptions", "v1beta1.Empty", "v1beta1.DevicePluginOptions", False),
    ("/v1beta1.DevicePlugin/ListAndWatch", "v1beta1.Empty", "v1beta1.ListAndWatchResponse", True),
    (
        "/v1beta1.DevicePlugin/GetPreferredAllocation",
        "v1beta1.PreferredAllocationRequest",
        "v1beta1.PreferredAllocationResponse",
        False,
    ),
    ("/v1beta1.DevicePlugin/Allocate", "v1beta1.AllocateRequest", "v1beta1.AllocateResponse", False),
    (
        "/v1beta1.DevicePlugin/PreStartContainer",
        "v1beta1.PreStartContainerRequest",
        "v1beta1.PreStartContainerResponse",
        False,
    ),
]

PLUGINREGISTRATION_MESSAGES: dict[str, list[FieldRow]] = {
    "pluginregistration.PluginInfo": [
        ("type", 1, "string", S),
        ("name", 2, "string", S),
        ("endpoint", 3, "string", S),
        ("supported_versions", 4, "string", R),
    ],
    "pluginregistration.RegistrationStatus": [
        ("plugin_registered", 1, "bool", S),
        ("error", 2, "string", S),
    ],
    "pluginregistration.RegistrationStatusResponse": [],
    "pluginregistration.InfoRequest": [],
}

PLUGINREGISTRATION_METHODS: list[MethodRow] = [
    (
        "/pluginregistration.Registration/GetInfo",
        "pluginregistration.InfoRequest",
        "pluginregistration.PluginInfo",
        False,
    ),
    (
        "/pluginregistration.Registration/NotifyRegistrationStatus",
        "pluginregistration.RegistrationStatus",
        "pluginregistration.RegistrationStatusResponse",
        False,
    ),
]

DRA_V1_MESSAGES: dict[str, list[FieldRow]] = {
    f"{DRA1}.NodePrepareResourcesRequest": [("claims", 1, f"{DRA1}.Claim", R)],
    f"{DRA1}.NodePrepareResourcesResponse": [("claims", 1, f"map<string,{DRA1}.NodePrepareResourceResponse>", R)],
    f"{DRA1}.NodePrepareResourceResponse": [
        ("devices", 1, f"{DRA1}.Device", R),
        ("error", 2, "string", S),
    ],
    f"{DRA1}.Device": [
        ("request_names", 1, "string", R),
        ("pool_name", 2, "string", S),
        ("device_name", 3, "string", S),
        ("cdi_device_ids", 4, "string", R),
        ("share_id", 5, "string", OPT),
    ],
    f"{DRA1}.NodeUnprepareResourcesRequest": [("claims", 1, f"{DRA1}.Claim", R)],
    f"{DRA1}.NodeUnprepareResourcesResponse": [
        ("claims", 1, f"map<string,{DRA1}.NodeUnprepareResourceResponse>", R),
    ],
    f"{DRA1}.NodeUnprepareResourceResponse": [("error", 1, "string", S)],
    f"{DRA1}.Claim": [
        ("namespace", 1, "string", S),
        ("uid", 2, "string", S),
        ("name", 3, "string", S),
    ],
}

DRA_V1_METHODS: list[MethodRow] = [
    (
        f"/{DRA1}.DRAPlugin/NodePrepareResources",
        f"{DRA1}.NodePrepareResourcesRequest",
        f"{DRA1}.NodePrepareResourcesResponse",
        False,
    ),
    (
        f"/{DRA1}.DRAPlugin/NodeUnprepareResources",
        f"{DRA1}.NodeUnprepareResourcesRequest",
        f"{DRA1}.NodeUnprepareResourcesResponse",
        False,
    ),
]

DRA_V1BETA1_MESSAGES: dict[str, list[FieldRow]] = {
    f"{DRA1B1}.NodePrepareResourcesRequest": [("claims", 1, f"{DRA1B1}.Claim", R)],
    f"{DRA1B1}.NodePrepareResourcesResponse": [
        ("claims", 1, f"map<string,{DRA1B1}.NodePrepareResourceResponse>", R),
    ],
    f"{DRA1B1}.NodePrepareResourceResponse": [
        ("devices", 1, f"{DRA1B1}.Device", R),
        ("error", 2, "string", S),
    ],
    f"{DRA1B1}.Device": [
        ("request_names", 1, "string", R),
        ("pool_name", 2, "string", S),
        ("device_name", 3, "string", S),
        ("cdi_device_ids", 4, "string", R),
    ],
    f"{DRA1B1}.NodeUnprepareResourcesRequest": [("claims", 1, f"{DRA1B1}.Claim", R)],
    f"{DRA1B1}.NodeUnprepareResourcesResponse": [
        ("claims", 1, f"map<string,{DRA1B1}.NodeUnprepareResourceResponse>", R),
    ],
    f"{DRA1B1}.NodeUnprepareResourceResponse": [("error", 1, "string", S)],
    f"{DRA1B1}.Claim": [
        ("namespace", 1, "string", S),
        ("uid", 2, "string", S),
        ("name", 3, "string", S),
    ],
}

DRA_V1BETA1_METHODS: list[MethodRow] = [
    (
        f"/{DRA1B1}.DRAPlugin/NodePrepareResources",
        f"{DRA1B1}.NodePrepareResourcesRequest",
        f"{DRA1B1}.NodePrepareResourcesResponse",
        False,
    ),
    (
        f"/{DRA1B1}.DRAPlugin/NodeUnprepareResources",
        f"{DRA1B1}.NodeUnprepareResourcesRequest",
        f"{DRA1B1}.NodeUnprepareResourcesResponse",
        False,
    ),
]

DRA_HEALTH_MESSAGES: dict[str, list[FieldRow]] = {
    "v1alpha1.NodeWatchResourcesRequest": [],
    "v1alpha1.DeviceIdentifier": [
        ("pool_name", 1, "string", S),
        ("device_name", 2, "string", S),
    ],
    "v1alpha1.DeviceHealth": [
        ("device", 1, "v1alpha1.DeviceIdentifier", S),
        ("health", 2, "enum v1alpha1.HealthStatus", S),
        ("last_updated_time", 3, "int64", S),
        ("health_check_timeout_seconds", 4, "int64", S),
        ("message", 5, "string", S),
    ],
    "v1alpha1.NodeWatchResourcesResponse": [("devices", 1, "v1alpha1.DeviceHealth", R)],
}

DRA_HEALTH_METHODS: list[MethodRow] = [
    (
        "/v1alpha1.DRAResourceHealth/NodeWatchResources",
        "v1alpha1.NodeWatchResourcesRequest",
        "v1alpha1.NodeWatchResourcesResponse",
        True,
    ),
]

PODRESOURCES_MESSAGES: dict[str, list[FieldRow]] = {
    "v1.AllocatableResourcesRequest": [],
    "v1.AllocatableResourcesResponse": [
        ("devices", 1, "v1.ContainerDevices", R),
        ("cpu_ids", 2, "int64", R),
        ("memory", 3, "v1.ContainerMemory", R),
    ],
    "v1.ListPodResourcesRequest": [],
    "v1.ListPodResourcesResponse": [("pod_resources", 1, "v1.PodResources", R)],
    "v1.PodResources": [
        ("name", 1, "string", S),
        ("namespace", 2, "string", S),
        ("containers", 3, "v1.ContainerResources", R),
        ("cpu_ids", 4, "int64", R),
        ("memory", 5, "v1.ContainerMemory", R),
    ],
    "v1.ContainerResources": [
        ("name", 1, "string", S),
        ("devices", 2, "v1.ContainerDevices", R),
        ("cpu_ids", 3, "int64", R),
        ("memory", 4, "v1.ContainerMemory", R),
        ("dynamic_resources", 5, "v1.DynamicResource", R),
    ],
    "v1.ContainerMemory": [
        ("memory_type", 1, "string", S),
        ("size", 2, "uint64", S),
        ("topology", 3, "v1.TopologyInfo", S),
    ],
    "v1.ContainerDevices": [
        ("resource_name", 1, "string", S),
        ("device_ids", 2, "string", R),
        ("topology", 3, "v1.TopologyInfo", S),
    ],
    "v1.TopologyInfo": [("nodes", 1, "v1.NUMANode", R)],
    "v1.NUMANode": [("ID", 1, "int64", S)],
    "v1.DynamicResource": [
        ("claim_name", 2, "string", S),
        ("claim_namespace", 3, "string", S),
        ("claim_resources", 4, "v1.ClaimResource", R),
    ],
    "v1.ClaimResource": [
        ("cdi_devices", 1, "v1.CDIDevice", R),
        ("driver_name", 2, "string", S),
        ("pool_name", 3, "string", S),
        ("device_name", 4, "string", S),
        ("share_id", 5, "string", OPT),
    ],
    "v1.CDIDevice": [("name", 1, "string", S)],
    "v1.GetPodResourcesRequest": [
        ("pod_name", 1, "string", S),
        ("pod_namespace", 2, "string", S),
    ],
    "v1.GetPodResourcesResponse": [("pod_resources", 1, "v1.PodResources", S)],
}

PODRESOURCES_METHODS: list[MethodRow] = [
    ("/v1.PodResourcesLister/List", "v1.ListPodResourcesRequest", "v1.ListPodResourcesResponse", False),
    (
        "/v1.PodResourcesLister/GetAllocatableResources",
        "v1.AllocatableResourcesRequest",
        "v1.AllocatableResourcesResponse",
        False,
    ),
    ("/v1.PodResourcesLister/Get", "v1.GetPodResourcesRequest", "v1.GetPodResourcesResponse", False),
]

# (generated module stem, proto package, messages, methods, enums {name: [(value name, number)]})
APIS: list[tuple[str, str, dict[str, list[FieldRow]], list[MethodRow], dict[str, list[tuple[str, int]]]]] = [
    ("deviceplugin_v1beta1", "v1beta1", DEVICEPLUGIN_MESSAGES, DEVICEPLUGIN_METHODS, {}),
    ("pluginregistration_v1", "pluginregistration", PLUGINREGISTRATION_MESSAGES, PLUGINREGISTRATION_METHODS, {}),
    ("dra_v1", DRA1, DRA_V1_MESSAGES, DRA_V1_METHODS, {}),
    ("dra_v1beta1", DRA1B1, DRA_V1BETA1_MESSAGES, DRA_V1BETA1_METHODS, {}),
    (
        "dra_health_v1alpha1",
        "v1alpha1",
        DRA_HEALTH_MESSAGES,
        DRA_HEALTH_METHODS,
        {"v1alpha1.HealthStatus": [("UNKNOWN", 0), ("HEALTHY", 1), ("UNHEALTHY", 2)]},
    ),
    ("podresources_v1", "v1", PODRESOURCES_MESSAGES, PODRESOURCES_METHODS, {}),
]
API_IDS = [api[0] for api in APIS]

# ---------------------------------------------------------------------------
# Helpers
# ---------------------------------------------------------------------------


def _pb2(stem: str) -> ModuleType:
    module: ModuleType = getattr(kubeletapi, f"{stem}_pb2")
    return module


def _pb2_grpc(stem: str) -> ModuleType:
    module: ModuleType = getattr(kubeletapi, f"{stem}_pb2_grpc")
    return module


def _file_proto(stem: str) -> descriptor_pb2.FileDescriptorProto:
    proto = descriptor_pb2.FileDescriptorProto()
    _pb2(stem).DESCRIPTOR.CopyToProto(proto)
    return proto


def _type_name(field: descriptor_pb2.FieldDescriptorProto, maps: dict[str, descriptor_pb2.DescriptorProto]) -> str:
    referenced = field.type_name.lstrip(".")
    if field.type == descriptor_pb2.FieldDescriptorProto.TYPE_MESSAGE:
        entry = maps.get(referenced)
        if entry is None:
            return referenced
        key, value = entry.field
        return f"map<{_type_name(key, {})},{_type_name(value, {})}>"
    if field.type == descriptor_pb2.FieldDescriptorProto.TYPE_ENUM:
        return f"enum {referenced}"
    return descriptor_pb2.FieldDescriptorProto.Type.Name(field.type).removeprefix("TYPE_").lower()


def _label(field: descriptor_pb2.FieldDescriptorProto) -> str:
    if field.label == descriptor_pb2.FieldDescriptorProto.LABEL_REPEATED:
        return R
    return OPT if field.proto3_optional else S


def _messages_from_descriptor(proto: descriptor_pb2.FileDescriptorProto) -> dict[str, list[FieldRow]]:
    """Render every top-level message as the table rows used above."""
    found: dict[str, list[FieldRow]] = {}
    for message in proto.message_type:
        full = f"{proto.package}.{message.name}"
        maps = {f"{full}.{nested.name}": nested for nested in message.nested_type if nested.options.map_entry}
        assert len(maps) == len(message.nested_type), f"{full} has nested types other than map entries"
        assert not message.enum_type, f"{full} has nested enums"
        found[full] = [(f.name, f.number, _type_name(f, maps), _label(f)) for f in message.field]
    return found


def _methods_from_descriptor(proto: descriptor_pb2.FileDescriptorProto) -> list[MethodRow]:
    rows: list[MethodRow] = []
    for service in proto.service:
        for method in service.method:
            assert not method.client_streaming, f"{service.name}.{method.name} must not be client-streaming"
            rows.append(
                (
                    f"/{proto.package}.{service.name}/{method.name}",
                    method.input_type.lstrip("."),
                    method.output_type.lstrip("."),
                    method.server_streaming,
                )
            )
    return rows


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
    for stem in API_IDS:
        source = Path(_pb2_grpc(stem).__file__ or "").read_text(encoding="utf-8")
        assert f"from . import {stem}_pb2 as " in source
        assert f"\nimport {stem}_pb2" not in source


def test_relativize_imports_only_touches_local_modules(gen_protos: ModuleType) -> None:
    source = "import grpc\nimport a_pb2 as a__pb2\nfrom b_pb2 import X\nimport other_pb2 as o\n"
    fixed = gen_protos.relativize_imports(source, {"a_pb2", "b_pb2"})
    assert fixed == "import grpc\nfrom . import a_pb2 as a__pb2\nfrom .b_pb2 import X\nimport other_pb2 as o\n"


# ---------------------------------------------------------------------------
# Wire exactness via descriptors
# ---------------------------------------------------------------------------


@pytest.mark.parametrize(("stem", "package", "messages", "methods", "enums"), APIS, ids=API_IDS)
def test_file_header_is_plain_proto3(stem: str, package: str, messages: object, methods: object, enums: object) -> None:
    proto = _file_proto(stem)
    assert proto.syntax == "proto3"
    assert proto.package == package
    assert list(proto.dependency) == [], "no imports (gogo.proto must not be used)"


@pytest.mark.parametrize(("stem", "package", "messages", "methods", "enums"), APIS, ids=API_IDS)
def test_messages_and_fields_match_kubelet(
    stem: str,
    package: str,
    messages: dict[str, list[FieldRow]],
    methods: object,
    enums: object,
) -> None:
    found = _messages_from_descriptor(_file_proto(stem))
    assert sorted(found) == sorted(messages), "message set differs"
    for name, rows in messages.items():
        assert sorted(found[name], key=lambda r: r[1]) == rows, name


@pytest.mark.parametrize(("stem", "package", "messages", "methods", "enums"), APIS, ids=API_IDS)
def test_services_and_methods_match_kubelet(
    stem: str, package: str, messages: object, methods: list[MethodRow], enums: object
) -> None:
    assert _methods_from_descriptor(_file_proto(stem)) == methods


@pytest.mark.parametrize(("stem", "package", "messages", "methods", "enums"), APIS, ids=API_IDS)
def test_enums_match_kubelet(
    stem: str, package: str, messages: object, methods: object, enums: dict[str, list[tuple[str, int]]]
) -> None:
    proto = _file_proto(stem)
    found = {f"{proto.package}.{e.name}": [(v.name, v.number) for v in e.value] for e in proto.enum_type}
    assert found == enums


@pytest.mark.parametrize(("stem", "package", "messages", "methods", "enums"), APIS, ids=API_IDS)
def test_generated_stubs_and_servicers_use_wire_paths(
    stem: str, package: str, messages: object, methods: list[MethodRow], enums: object
) -> None:
    module = _pb2_grpc(stem)
    expected = [(path, streaming) for path, _, _, streaming in methods]
    channel = _RecordingChannel()
    server = _RecordingServer()
    for service in _file_proto(stem).service:
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
