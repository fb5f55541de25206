"""Atomic CDI spec files: one transient spec per claim in the CDI root (``/var/run/cdi`` by default).

Naming follows the CDI facts: kind ``<vendor>/<class>``, transient file ``<vendor>-<class>_<id>.json``, fully
qualified device names ``<vendor>/<class>=<name>``. The declared ``cdiVersion`` is the minimum the edits need.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from accel_core.atomic import atomic_write_text, create_file
from accel_core.edits import ContainerEdits

#: The minimum version for what this writer emits: device-node ``hostPath`` and device names that start with a
#: digit (claim UIDs) need 0.5.0; nothing written here (no annotations, intelRdt, netDevices) needs more.
CDI_VERSION = "0.5.0"
#: CDI device names (and our spec ids): letters, digits, ``_ . : -``, starting and ending with a letter or digit
#: (containerd's CDI library refuses the whole spec for a name that ends otherwise).
#: Characters a YAML reader refuses raw (containerd's CDI library reads specs as YAML): DEL and the C1 controls but
#: NEL, and the two BMP non-characters. json.dumps already escapes the C0 controls.
_YAML_UNPRINTABLE = re.compile("[\x7f-\x84\x86-\x9f\ufffe\uffff]")
_NAME_RE = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9_.:-]*[A-Za-z0-9])?", re.ASCII)


class CdiError(Exception):
    """A CDI spec could not be written or read; the message names the file."""


def _edits_json(edits: ContainerEdits) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if edits.env:
        out["env"] = [f"{k}={v}" for k, v in edits.env]
    if edits.device_nodes:
        nodes = []
        for n in edits.device_nodes:
            node: dict[str, Any] = {"path": n.path}
            if n.host_path and n.host_path != n.path:
                node["hostPath"] = n.host_path
            if n.permissions:
                node["permissions"] = n.permissions
            if n.major is not None and n.minor is not None:
                node.update(type="c", major=n.major, minor=n.minor)
            nodes.append(node)
        out["deviceNodes"] = nodes
    if edits.mounts:
        out["mounts"] = [{"hostPath": m.host_path, "containerPath": m.container_path,
                          "options": ["ro" if m.read_only else "rw", "nosuid", "nodev", "bind"]} for m in edits.mounts]
    return out


class CdiSpecWriter:
    """Writes and removes per-claim transient CDI specs for one kind ``<vendor>/<cls>``."""

    def __init__(self, root: Path, vendor: str, cls: str) -> None:
        self.root = Path(root)
        self.vendor = vendor
        self.cls = cls

    @property
    def kind(self) -> str:
        return f"{self.vendor}/{self.cls}"

    def qualified(self, device_name: str) -> str:
        return f"{self.kind}={device_name}"

    def spec_path(self, spec_id: str) -> Path:
        return self.root / f"{self.vendor}-{self.cls}_{spec_id.replace('/', '_')}.json"

    def names_a_file(self, spec_id: str) -> bool:
        """True when ``spec_id`` makes a plain file name (valid characters, at most 255 bytes with the affixes)."""
        return (len(spec_id) <= 255 and _NAME_RE.fullmatch(spec_id) is not None
                and len(self.spec_path(spec_id).name) <= 255)

    def check(self, spec_id: str, names: Iterable[str]) -> None:
        """CdiError unless ``spec_id`` makes a plain file name and every device name is valid (and there is one)."""
        if not self.names_a_file(spec_id):
            raise CdiError(f"invalid CDI spec id {spec_id[:64]!r}")
        count = 0
        for name in names:
            if not _NAME_RE.fullmatch(name):
                raise CdiError(f"invalid CDI device name {name[:96]!r} for {self.spec_path(spec_id)}")
            count += 1
        if not count:
            raise CdiError(f"CDI spec {self.spec_path(spec_id)} would have no devices")

    def render(self, spec_id: str, devices: Iterable[tuple[str, ContainerEdits]],
               common: ContainerEdits | None = None) -> tuple[str, list[str]]:
        """The spec file's text for ``spec_id`` and the fully qualified device IDs (CdiError for bad names)."""
        devices = list(devices)
        self.check(spec_id, (name for name, _ in devices))
        entries = [{"name": name, "containerEdits": _edits_json(edits)} for name, edits in devices]
        for entry in entries:
            if not entry["containerEdits"]:  # containerd's CDI library refuses the whole spec for such a device
                raise CdiError(f"CDI device {entry['name']!r} for {self.spec_path(spec_id)} has no container edits")
        spec: dict[str, Any] = {"cdiVersion": CDI_VERSION, "kind": self.kind, "devices": entries}
        if common is not None:
            spec["containerEdits"] = _edits_json(common)
        # UTF-8, not \u escapes: the CDI library's YAML decoder refuses the surrogate pairs json writes beyond the BMP.
        # What YAML refuses raw is escaped (valid JSON and YAML); structure is ASCII, so only string values change.
        text = json.dumps(spec, indent=2, ensure_ascii=False) + "\n"
        text = _YAML_UNPRINTABLE.sub(lambda m: f"\\u{ord(m.group()):04x}", text)
        try:
            text.encode()
        except UnicodeEncodeError as exc:  # a lone surrogate in a value
            raise CdiError(f"CDI spec {self.spec_path(spec_id)} would not be valid UTF-8: {exc.reason}") from exc
        return text, [self.qualified(name) for name, _ in devices]

    def write(self, spec_id: str, devices: Iterable[tuple[str, ContainerEdits]],
              common: ContainerEdits | None = None) -> list[str]:
        """Write the spec for ``spec_id`` (a claim UID); return the fully qualified device IDs.

        A new spec is created in place (one ``open``, one ``write``): no container runtime acts on a claim's spec
        before the kubelet has the prepare's answer, which comes after the write. An existing spec (re-created
        after a restart) is replaced atomically (temp file and rename), since a runtime may be reading it. Neither
        is synced to disk: a spec is derived state, re-created from the durable checkpoint at start (the CDI root
        is a tmpfs on most hosts anyway), so a power loss that eats it costs nothing, and a prepare does not pay a
        sync per spec. A kill mid-write leaves a partial spec, which start removes (no entry refers to it) or
        rewrites (an entry does: :meth:`matches` fails)."""
        text, ids = self.render(spec_id, devices, common)
        path = self.spec_path(spec_id)
        try:
            self.root.mkdir(parents=True, exist_ok=True)
            data = text.encode()
            if not create_file(path, data):
                atomic_write_text(path, data, mode=0o644, durable=False)
        except OSError as exc:
            raise CdiError(f"cannot write CDI spec {path}: {exc}") from exc
        return ids

    def matches(self, spec_id: str, devices: Iterable[tuple[str, ContainerEdits]],
                common: ContainerEdits | None = None) -> bool:
        """True when the spec file holds exactly what :meth:`write` would write (False if missing or damaged)."""
        text, _ = self.render(spec_id, devices, common)
        try:
            return self.spec_path(spec_id).read_bytes() == text.encode()
        except (OSError, UnicodeDecodeError):
            return False

    def read(self, spec_id: str) -> dict[str, Any] | None:
        path = self.spec_path(spec_id)
        try:
            data: dict[str, Any] = json.loads(path.read_bytes())
            return data
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as exc:
            raise CdiError(f"unreadable CDI spec {path}: {exc}") from exc

    def exists(self, spec_id: str) -> bool:
        return self.names_a_file(spec_id) and self.spec_path(spec_id).is_file()

    def remove(self, spec_id: str) -> bool:
        """Remove the spec; True if it existed. Idempotent; an id that cannot name a spec of ours has none."""
        if not self.names_a_file(spec_id):
            return False
        try:
            os.unlink(self.spec_path(spec_id))
            return True
        except FileNotFoundError:
            return False
        except OSError as exc:
            raise CdiError(f"cannot remove CDI spec {self.spec_path(spec_id)}: {exc}") from exc

    def spec_ids(self) -> list[str]:
        prefix = f"{self.vendor}-{self.cls}_"
        out = []
        with contextlib.suppress(FileNotFoundError):
            for entry in os.scandir(self.root):
                if entry.name.startswith(prefix) and entry.name.endswith(".json"):
                    out.append(entry.name[len(prefix): -len(".json")])
        return sorted(out)
