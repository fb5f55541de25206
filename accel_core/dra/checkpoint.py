"""An atomic, checksummed JSON checkpoint for prepared claims, tagged with the host's boot ID.

Fail closed on a corrupt file for prepare (the caller refuses to guess), stay lenient for unprepare: ``load``
raises CheckpointError and the caller decides. A boot ID different from the current one means the host rebooted:
transient state (CDI specs under /var/run) is gone and must be re-created.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from accel_core.atomic import atomic_write_text, clean_stale_temp_files
from accel_core.hostfiles import HostValueError, read_label

CHECKPOINT_VERSION = "v1"


class CheckpointError(Exception):
    """The checkpoint exists but cannot be trusted; the message names the file."""


@dataclass
class Checkpoint:
    """Prepared-claim entries keyed by claim UID; each entry is a driver-defined JSON object with a ``state``."""

    boot_id: str = ""
    claims: dict[str, dict[str, Any]] = field(default_factory=dict)


def _canonical(body: dict[str, Any]) -> str:
    return json.dumps(body, sort_keys=True, separators=(",", ":"))


def _checksum(body: dict[str, Any]) -> str:
    return hashlib.sha256(_canonical(body).encode()).hexdigest()


class CheckpointFile:
    """Reads and writes one checkpoint file atomically."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)

    def load(self) -> Checkpoint:
        """Read the checkpoint (done once at start; it also removes temp files a killed writer left beside it)."""
        clean_stale_temp_files(self.path.parent)
        try:
            raw = self.path.read_text()
        except FileNotFoundError:
            return Checkpoint()
        except OSError as exc:
            raise CheckpointError(f"cannot read checkpoint {self.path}: {exc}") from exc
        try:
            doc = json.loads(raw)
            body = doc["body"]
            if doc.get("checksum") != _checksum(body):
                raise CheckpointError(f"checkpoint {self.path} failed its checksum (corrupt or edited)")
            if body.get("version") != CHECKPOINT_VERSION:
                raise CheckpointError(f"checkpoint {self.path} has unknown version {body.get('version')!r}")
            claims = body["claims"]
            if not isinstance(claims, dict):
                raise CheckpointError(f"checkpoint {self.path}: 'claims' is not an object")
            return Checkpoint(boot_id=str(body.get("bootId", "")), claims=claims)
        except CheckpointError:
            raise
        except (ValueError, KeyError, TypeError) as exc:
            raise CheckpointError(f"checkpoint {self.path} is malformed: {exc}") from exc

    def save(self, checkpoint: Checkpoint) -> None:
        """Write atomically and durably (one file sync, one directory sync). The body is serialized once, in the
        canonical form its checksum covers (compact, sorted keys), and spliced into the document."""
        body = _canonical({"version": CHECKPOINT_VERSION, "bootId": checkpoint.boot_id, "claims": checkpoint.claims})
        checksum = hashlib.sha256(body.encode()).hexdigest()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_text(self.path, f'{{"body":{body},"checksum":"{checksum}"}}\n')


def read_boot_id(host_root: Path) -> str:
    """The kernel's boot ID under the host root, or "" when it cannot be read."""
    try:
        return read_label(str(Path(host_root) / "proc/sys/kernel/random/boot_id"), "/proc/sys/kernel/random/boot_id")
    except HostValueError:
        return ""
