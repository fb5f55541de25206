"""The kubelet API protos are wire-exact: the descriptors of our generated modules are compared with the upstream
k8s.io/kubelet .proto files of the Kubernetes release the project builds (package, messages, field names, numbers,
types and labels, enums, services and streaming flags), so any drift in ``protos/`` fails here. Needs Go (``go mod
download`` of the upstream module).
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import tempfile
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from google.protobuf import descriptor_pb2
from grpc_tools import protoc

from accel_core import kubeletapi

REPO_ROOT = Path(__file__).resolve().parents[3]

pytestmark = pytest.mark.gotools  # go mod download of the upstream .proto files

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


