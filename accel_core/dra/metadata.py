"""Device metadata inside the container (KEP-5304), in the layout, file names and format of Kubernetes' kubelet-plugin
helper (k8s.io/dynamic-resource-allocation v0.37, ``api/metadata`` and ``kubeletplugin/metadata.go``):

- on the host, one file per claim request:
  ``<plugins dir>/<driver>/dra-device-metadata/<namespace>_<claim>/<request>/metadata.json`` (mode 0644, its
  directories 0755), removed with the claim at unprepare;
- in the container, that file bind-mounted read-only at
  ``/var/run/kubernetes.io/dra-device-attributes/resourceclaims/<claim>/<request>/<driver>-metadata.json`` for a claim
  the pod spec names, or at ``.../resourceclaimtemplates/<pod claim name>/<request>/<driver>-metadata.json`` for a
  claim made from a template (the claim's ``resource.kubernetes.io/pod-claim-name`` annotation gives that name,
  since the claim's own name is generated);
- the content: the same ``DeviceMetadata`` object once per API version, newest first, each object followed by a
  newline (``metadata.resource.k8s.io/v1beta1``, then ``v1alpha1``: their fields are the same): the claim's name,
  namespace, UID and generation 1, ``podClaimName`` when there is one, and one request (``request/subrequest`` when
  a prioritized list chose a subrequest; the path uses the request alone) with each device's driver, pool, name and
  attributes (ResourceSlice form: ``{"int": 2}``, ``{"string": ...}``).

Here the mount is one more edit of the request's own CDI entry (:mod:`accel_core.dra.prepared`), which every
container of the request gets exactly once, and which the checkpoint keeps, so a lost spec comes back with it.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec

from accel_core.atomic import atomic_write_text, create_file
from accel_core.dra.slicemodel import AttributeValue, Version
from accel_core.edits import Mount
from accel_core.k8snames import is_label, is_subdomain, object_name_problem

CONTAINER_DIR = "/var/run/kubernetes.io/dra-device-attributes"
CLAIMS_SUBDIR = "resourceclaims"
TEMPLATES_SUBDIR = "resourceclaimtemplates"
FILE_SUFFIX = "-metadata.json"
HOST_SUBDIR = "dra-device-metadata"
HOST_FILE = "metadata.json"
POD_CLAIM_NAME_ANNOTATION = "resource.kubernetes.io/pod-claim-name"
#: newest first, as consumers read the first version they know
VERSIONS = ("metadata.resource.k8s.io/v1beta1", "metadata.resource.k8s.io/v1alpha1")
#: the API's limit on attributes per device in a metadata file
MAX_ATTRIBUTES = 32
_ENCODER = msgspec.json.Encoder()


@dataclass(frozen=True)
class ClaimIdentity:
    namespace: str
    name: str
    uid: str
    pod_claim_name: str | None = None

    @classmethod
    def of(cls, namespace: str, name: str, uid: str, annotations: Mapping[str, str] | None) -> ClaimIdentity:
        """The pod claim name from the annotation, kept only when it is a valid pod claim name (a DNS label): it
        becomes a path segment in the container."""
        pod_claim = (annotations or {}).get(POD_CLAIM_NAME_ANNOTATION)
        return cls(namespace, name, uid, pod_claim if isinstance(pod_claim, str) and is_label(pod_claim) else None)


@dataclass(frozen=True)
class MetadataDevice:
    pool: str
    name: str
    attributes: Mapping[str, AttributeValue]
    network: Mapping[str, object] | None = None
    """``networkData`` (interfaceName, ips, hardwareAddress), as in the claim's status."""
    published: Mapping[str, Any] | None = None
    """The published attributes already in file form (:func:`encoded_attributes`, made once per scan), under
    ``attributes``."""


def encoded_attributes(attributes: Mapping[str, AttributeValue]) -> dict[str, Any]:
    """Attributes in the file's form (``{"int": 2}``), in name order, as a device's published ones are kept."""
    return {k: attribute_json(v) for k, v in sorted(attributes.items())}


def attribute_json(value: AttributeValue) -> dict[str, Any]:
    if isinstance(value, bool):
        return {"bool": value}
    if isinstance(value, int):
        return {"int": value}
    if isinstance(value, Version):
        return {"version": value.value}
    return {"string": value}


def base_request(request: str) -> str:
    """``request`` of ``request/subrequest``."""
    return request.split("/", 1)[0]


class MetadataFiles:
    """Writes and removes one driver's metadata files; blocking (call it from the thread that prepares)."""

    def __init__(self, driver: str, driver_dir: Path) -> None:
        if not is_subdomain(driver):
            raise ValueError(f"driver name {driver!r} is not a DNS subdomain")
        self.driver = driver
        self.root = driver_dir / HOST_SUBDIR

    def claim_dir(self, claim: ClaimIdentity) -> Path:
        return self._dir(claim.namespace, claim.name)

    def _dir(self, namespace: str, name: str) -> Path:
        """``<namespace>_<name>``, checked first: names from a request never reach a path unchecked."""
        problem = object_name_problem(namespace, name)
        if problem:
            raise ValueError(problem)
        return self.root / f"{namespace}_{name}"

    def container_file(self, claim: ClaimIdentity, request: str) -> str:
        leaf = f"{base_request(request)}/{self.driver}{FILE_SUFFIX}"
        if claim.pod_claim_name:
            return f"{CONTAINER_DIR}/{TEMPLATES_SUBDIR}/{claim.pod_claim_name}/{leaf}"
        return f"{CONTAINER_DIR}/{CLAIMS_SUBDIR}/{claim.name}/{leaf}"

    def document(self, claim: ClaimIdentity, request: str, devices: Sequence[MetadataDevice]) -> str:
        """The file's content: the object once per version, newest first, two-space indented."""
        return self._encode(self._body(claim, request, devices)).decode()

    def _body(self, claim: ClaimIdentity, request: str, devices: Sequence[MetadataDevice]) -> dict[str, Any]:
        meta: dict[str, Any] = {"name": claim.name, "namespace": claim.namespace, "uid": claim.uid, "generation": 1}
        body: dict[str, Any] = {"metadata": meta}
        if claim.pod_claim_name:
            body["podClaimName"] = claim.pod_claim_name
        body["requests"] = [{"name": request, "devices": [self._device(d) for d in devices]}]
        return body

    @staticmethod
    def _encode(body: Mapping[str, Any]) -> bytes:
        return b"".join(msgspec.json.format(_ENCODER.encode({"kind": "DeviceMetadata", "apiVersion": version,
                                                               **body}), indent=2) + b"\n"
                        for version in VERSIONS)

    def _device(self, device: MetadataDevice) -> dict[str, Any]:
        out: dict[str, Any] = {"driver": self.driver, "pool": device.pool, "name": device.name}
        attributes = {**(device.published or {}), **{k: attribute_json(v) for k, v in device.attributes.items()}}
        if len(attributes) > MAX_ATTRIBUTES:
            attributes = dict(sorted(attributes.items())[:MAX_ATTRIBUTES])
        if attributes:
            out["attributes"] = attributes
        if device.network:
            out["networkData"] = dict(device.network)
        return out

    def write(self, claim: ClaimIdentity, request: str, devices: Sequence[MetadataDevice]) -> Mount:
        """Write the request's file (replacing any earlier one) and return the mount that puts it in the container."""
        claim_dir = str(self.claim_dir(claim))
        request_dir = f"{claim_dir}/{base_request(request)}"
        for directory in (claim_dir, request_dir):  # two levels under the root: no recursion, no exception raised
            try:
                os.mkdir(directory, 0o755)
            except FileExistsError:
                pass
            except FileNotFoundError:  # the first claim: the root is made once
                os.makedirs(directory, 0o755, exist_ok=True)
        path = f"{request_dir}/{HOST_FILE}"
        # Not synced: the checkpoint is the record, and a lost or torn file is written again by the next prepare of
        # an unrecorded claim. A file already there (a claim of the same name with another UID, still prepared, or a
        # retried prepare) is replaced by a new one, never rewritten in place: containers that mount it keep theirs.
        data = self._encode(self._body(claim, request, devices))
        if not create_file(Path(path), data):
            atomic_write_text(Path(path), data, mode=0o644, durable=False)
        return Mount(host_path=path, container_path=self.container_file(claim, request), read_only=True)

    def remove(self, namespace: str, name: str) -> None:
        """Remove a claim's files (nothing there is not an error)."""
        self._remove(self._dir(namespace, name))

    def prune(self, keep: Iterable[tuple[str, str]]) -> list[str]:
        """Remove the files of every claim not in ``keep`` (namespace, name): those a killed or refused prepare left.
        Returns the removed directory names."""
        wanted = {f"{ns}_{name}" for ns, name in keep}
        try:
            entries = sorted(os.listdir(self.root))
        except FileNotFoundError:
            return []
        gone = [e for e in entries if e not in wanted]
        for entry in gone:
            self._remove(self.root / entry)
        return gone

    @staticmethod
    def _remove(target: Path) -> None:
        """A claim's directory (its request directories, each with its file), without rmtree's walk in the common
        case; anything else there (a link, a deeper tree) goes by rmtree, which never follows links."""
        try:
            with os.scandir(target) as requests:
                for request in requests:
                    if not request.is_dir(follow_symlinks=False):
                        os.unlink(request.path)
                        continue
                    with os.scandir(request.path) as files:
                        for file in files:
                            os.unlink(file.path)
                    os.rmdir(request.path)
            os.rmdir(target)
        except FileNotFoundError:
            return
        except NotADirectoryError:
            os.unlink(target)
        except OSError:  # a directory where a file belongs, or the like
            shutil.rmtree(target, ignore_errors=True)
