"""What fakecri recorded: one JSON line per CRI call, and the CreateContainer calls as :class:`ContainerRecord`
(devices, mounts, envs, CDI device names a container would get)."""

from __future__ import annotations

import base64
import binascii
import contextlib
import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


def read_cri_records(path: Path) -> Iterator[dict[str, Any]]:
    """Every call fakecri recorded so far in ``path`` (a partly written last line is skipped)."""
    try:
        with path.open() as f:
            for line in f:
                with contextlib.suppress(ValueError):
                    yield json.loads(line)
    except FileNotFoundError:
        return


@dataclass(frozen=True)
class ContainerRecord:
    """What the kubelet asked the runtime to give one container (from fakecri's CreateContainer record)."""

    pod: str
    namespace: str
    pod_uid: str
    name: str
    envs: dict[str, str]
    devices: tuple[dict[str, str], ...]
    mounts: tuple[dict[str, Any], ...]
    cdi_devices: tuple[str, ...]
    annotations: dict[str, str] = field(default_factory=dict)

    @property
    def device_paths(self) -> list[str]:
        """Host paths of the device nodes, in the order the kubelet passed them."""
        return [d.get("hostPath", "") for d in self.devices]


def _env_value(encoded: Any) -> str:
    """CRI ``KeyValue.value`` is ``bytes`` (protojson writes base64); env values here are UTF-8 text."""
    try:
        return base64.b64decode(str(encoded), validate=True).decode("utf-8", "replace")
    except (ValueError, binascii.Error):
        return str(encoded)


def container_records(lines: Iterator[dict[str, Any]]) -> list[ContainerRecord]:
    """The CreateContainer calls among fakecri's records, oldest first."""
    out = []
    for rec in lines:
        if rec.get("method") != "CreateContainer":
            continue
        req = rec.get("request", {})
        config = req.get("config", {})
        meta = req.get("sandboxConfig", {}).get("metadata", {})
        out.append(ContainerRecord(
            pod=str(meta.get("name", "")),
            namespace=str(meta.get("namespace", "")),
            pod_uid=str(meta.get("uid", "")),
            name=str(config.get("metadata", {}).get("name", "")),
            envs={str(e.get("key", "")): _env_value(e.get("value", "")) for e in config.get("envs", [])},
            devices=tuple(config.get("devices", [])),
            mounts=tuple(config.get("mounts", [])),
            cdi_devices=tuple(str(d.get("name", "")) for d in config.get("CDIDevices", config.get("cdiDevices", []))),
            annotations=dict(config.get("annotations", {})),
        ))
    return out
