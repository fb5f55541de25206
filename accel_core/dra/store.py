"""Prepared claims in memory, mirrored to the checkpoint (:mod:`accel_core.dra.checkpoint`) on every change.

A prepare records its claims ``PrepareCompleted`` once their CDI specs are written, with one journal record per
request (a snapshot now and then). Before a request changes anything, :meth:`ClaimStore.refresh` takes in what
another process (the other pod of a rolling update) recorded meanwhile.
``PrepareStarted`` entries (written by earlier versions before the CDI spec) are still read, and reserve their
devices like completed ones. The file carries the boot ID, so a restore can tell a restart from a reboot.

A corrupt or unreadable checkpoint is not guessed around: :attr:`ClaimStore.error` is set, prepares fail with
that message (fail closed), and unprepares still remove CDI specs (lenient).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from accel_core.dra.checkpoint import Checkpoint, CheckpointError, CheckpointFile
from accel_core.dra.prepared import PreparedClaim, entry_format
from accel_core.logs import kv

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class LoadResult:
    claims: int
    previous_boot_id: str
    rebooted: bool


class ClaimStore:
    def __init__(self, path: Path, boot_id: str) -> None:
        self.file = CheckpointFile(path, entry_format)
        self.boot_id = boot_id
        self.error: str | None = None
        self._claims: dict[str, PreparedClaim] = {}

    @property
    def path(self) -> Path:
        return self.file.path

    def load(self) -> LoadResult:
        """Read the checkpoint; on a bad file set :attr:`error` and start empty (prepares then refuse)."""
        try:
            checkpoint = self.file.load()
            claims = {uid: PreparedClaim.from_json(uid, entry) for uid, entry in checkpoint.claims.items()}
        except (CheckpointError, ValueError) as exc:
            self._fail(exc)
            return LoadResult(0, "", False)
        self.error = None
        self._claims = claims
        rebooted = bool(checkpoint.boot_id) and bool(self.boot_id) and checkpoint.boot_id != self.boot_id
        if (checkpoint.boot_id != self.boot_id and claims) or self.file.legacy:
            self._save()  # record the current boot; or the journal's size, so a loss of its records is seen
        return LoadResult(len(claims), checkpoint.boot_id, rebooted)

    def refresh(self) -> bool:
        """Take in what another process recorded since the last look; True when anything changed. A checkpoint
        that became unusable meanwhile sets :attr:`error` (prepares then refuse)."""
        if self.error:
            return False
        try:
            checkpoint = self.file.refresh()
            if checkpoint is None:
                return False
            self._claims = {uid: PreparedClaim.from_json(uid, entry) for uid, entry in checkpoint.claims.items()}
        except (CheckpointError, ValueError) as exc:
            self._fail(exc)
        return True

    def compact(self) -> None:
        """Fold the journal into a new snapshot (on a clean stop: an older driver reads the snapshot alone)."""
        self.refresh()  # another process may have recorded changes since: the snapshot must hold them too
        if not self.error and self.file.journaled:
            self._save()

    def _fail(self, exc: Exception) -> None:
        self.error = str(exc)
        self._claims = {}
        log.error("checkpoint unusable: prepares are refused until it is fixed or moved away",
                  extra=kv(path=str(self.path), error=self.error))

    def get(self, uid: str) -> PreparedClaim | None:
        return self._claims.get(uid)

    def claims(self) -> list[PreparedClaim]:
        return list(self._claims.values())

    def holder(self, device: str, *, other_than: str) -> PreparedClaim | None:
        """The claim (other than ``other_than``) that holds ``device``, if any (admin access holds nothing)."""
        for uid, claim in self._claims.items():
            if uid != other_than and device in claim.held_devices:
                return claim
        return None

    def put_many(self, claims: Sequence[PreparedClaim]) -> None:
        """Add or replace entries with one durable checkpoint write (OSError propagates, and then all are rolled
        back)."""
        previous = {c.uid: self._claims.get(c.uid) for c in claims}
        self._claims.update((c.uid, c) for c in claims)
        try:
            self.file.record({c.uid: c.to_json() for c in claims}, (), self._snapshot)
        except OSError:
            for uid, before in previous.items():
                if before is None:
                    self._claims.pop(uid, None)
                else:
                    self._claims[uid] = before
            raise

    def remove_many(self, uids: Sequence[str]) -> dict[str, PreparedClaim]:
        """Drop the entries that exist with one checkpoint write; returns them (OSError propagates, and then every
        entry is kept, so a retry writes again)."""
        removed = {uid: self._claims.pop(uid) for uid in dict.fromkeys(uids) if uid in self._claims}
        if removed:
            try:
                self.file.record({}, list(removed), self._snapshot)
            except OSError:
                self._claims.update(removed)
                raise
        return removed

    def _snapshot(self) -> Checkpoint:
        return Checkpoint(self.boot_id, {uid: c.to_json() for uid, c in self._claims.items()})

    def _save(self) -> None:
        self.file.save(self._snapshot())
