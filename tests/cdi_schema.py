"""A JSON Schema for CDI spec files, written for these tests from the CDI facts in
../shared/reference/kubelet-apis.md section 5 (spec 1.1.0), and the rule that the features a spec uses must not need
a newer ``cdiVersion`` than it declares. Validation is done by the ``jsonschema`` library.
"""

from __future__ import annotations

from typing import Any

import jsonschema

_STRINGS = {"type": "array", "items": {"type": "string"}}
_STRING_MAP = {"type": "object", "additionalProperties": {"type": "string"}}
_ABSOLUTE = {"type": "string", "pattern": "^/"}
_UINT32 = {"type": "integer", "minimum": 0, "maximum": 2**32 - 1}

_EDITS: dict[str, Any] = {
    "type": "object",
    "additionalProperties": False,
    "properties": {
        "env": {"type": "array", "items": {"type": "string", "pattern": "^[^=]+="}},
        "deviceNodes": {"type": "array", "items": {
            "type": "object", "additionalProperties": False, "required": ["path"],
            "properties": {
                "path": _ABSOLUTE, "hostPath": _ABSOLUTE, "type": {"enum": ["b", "c", "u", "p"]},
                "major": {"type": "integer"}, "minor": {"type": "integer"}, "fileMode": {"type": "integer"},
                "permissions": {"type": "string", "pattern": "^[rwm]+$"}, "uid": _UINT32, "gid": _UINT32,
            }}},
        "mounts": {"type": "array", "items": {
            "type": "object", "additionalProperties": False, "required": ["hostPath", "containerPath"],
            "properties": {"hostPath": {"type": "string"}, "containerPath": _ABSOLUTE, "type": {"type": "string"},
                           "options": _STRINGS}}},
        "hooks": {"type": "array", "items": {
            "type": "object", "additionalProperties": False, "required": ["hookName", "path"],
            "properties": {
                "hookName": {"enum": ["createRuntime", "createContainer", "startContainer", "poststart", "poststop"]},
                "path": _ABSOLUTE, "args": _STRINGS, "env": _STRINGS, "timeout": {"type": "integer"}}}},
        "intelRdt": {"type": "object"},
        "additionalGids": {"type": "array", "items": _UINT32},
        "netDevices": {"type": "array", "items": {
            "type": "object", "additionalProperties": False, "required": ["hostInterfaceName", "name"],
            "properties": {"hostInterfaceName": {"type": "string"}, "name": {"type": "string"}}}},
    },
}

# kind = <vendor: DNS subdomain, at most 253> "/" <class: at most 63, alphanumeric at both ends, - _ . inside>
_VENDOR = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*"
_CLASS = r"[A-Za-z0-9]([A-Za-z0-9_.-]{0,61}[A-Za-z0-9])?"

CDI_SPEC_SCHEMA: dict[str, Any] = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "type": "object",
    "additionalProperties": False,
    "required": ["cdiVersion", "kind", "devices"],
    "properties": {
        "cdiVersion": {"type": "string", "pattern": r"^(0|[1-9]\d*)\.(0|[1-9]\d*)\.(0|[1-9]\d*)$"},
        "kind": {"type": "string", "pattern": f"^{_VENDOR}/{_CLASS}$", "maxLength": 253 + 1 + 63},
        "annotations": _STRING_MAP,
        "devices": {"type": "array", "minItems": 1, "items": {
            "type": "object", "additionalProperties": False, "required": ["name", "containerEdits"],
            "properties": {"name": {"type": "string", "pattern": "^[A-Za-z0-9][A-Za-z0-9_.:-]*$"},
                           "annotations": _STRING_MAP, "containerEdits": _EDITS}}},
        "containerEdits": _EDITS,
    },
}


def _version(text: str) -> tuple[int, ...]:
    return tuple(int(p) for p in text.split("."))


def _needed_version(spec: dict[str, Any]) -> tuple[tuple[int, ...], str]:
    """The lowest version that has every feature the spec uses (0.3.0 is the earliest accepted)."""
    needs: list[tuple[tuple[int, ...], str]] = [((0, 3, 0), "any spec")]
    edits = [spec.get("containerEdits") or {}] + [d.get("containerEdits") or {} for d in spec["devices"]]
    if any(m.get("type") for e in edits for m in e.get("mounts", [])):
        needs.append(((0, 4, 0), "mount type"))
    if any("hostPath" in n for e in edits for n in e.get("deviceNodes", [])):
        needs.append(((0, 5, 0), "deviceNode hostPath"))
    if any(d["name"][:1].isdigit() for d in spec["devices"]):
        needs.append(((0, 5, 0), "a device name starting with a digit"))
    if "annotations" in spec or any("annotations" in d for d in spec["devices"]):
        needs.append(((0, 6, 0), "annotations"))
    if "." in spec["kind"].split("/", 1)[1]:
        needs.append(((0, 6, 0), "a dot in the class name"))
    if any("intelRdt" in e or "additionalGids" in e for e in edits):
        needs.append(((0, 7, 0), "intelRdt/additionalGids"))
    if any("netDevices" in e for e in edits):
        needs.append(((1, 1, 0), "netDevices"))
    return max(needs)


def assert_valid_cdi_spec(spec: dict[str, Any]) -> None:
    """Fail with the schema's message, or with the feature that needs a newer cdiVersion than declared."""
    jsonschema.validate(spec, CDI_SPEC_SCHEMA, cls=jsonschema.Draft202012Validator)
    needed, feature = _needed_version(spec)
    assert _version(spec["cdiVersion"]) >= needed, (
        f"cdiVersion {spec['cdiVersion']} is too old for {feature} (needs {'.'.join(map(str, needed))})")
