"""The prepared-claims checkpoint: a checksummed JSON snapshot, plus a journal of the changes made since.

- ``checkpoint.json`` (the snapshot) holds every entry, the host's boot ID, the ID of the journal that goes with
  it and that journal file's size (``journalBytes``). It is replaced atomically and durably (temp file, fsync,
  rename, directory fsync) when the journal is full, when the boot ID changes, on a clean stop, and once at start
  when it was written by a version without ``journalBytes``.
- ``checkpoint.journal`` is a file of fixed size, written once full of *filler* lines (spaces ending in a newline,
  never a zero byte). Each prepare or unprepare request writes one record into it, in place after the previous
  one, and ``fdatasync``\\ s it before the kubelet gets an answer: no file is created or renamed, and only the
  changed entries are written (a snapshot write costs several times as much, and grows with the number of claims).
- A record is one line: the change as compact JSON (journal ID, sequence number, entries put, UIDs deleted), a
  tab, and the SHA-256 of that JSON. Records are read in order until the first one that does not check out:
  filler (never written), a torn record (a power loss mid-write, never answered), or a record of an earlier
  journal (left behind when a new snapshot started a new journal, from the file's start). A damaged record
  followed by intact records of the same journal is corruption, not a torn end, and the checkpoint is refused.

Every loss that can be seen is refused (:class:`CheckpointError`, naming the file), never read as "fewer claims":
a snapshot that names a journal which is missing or not ``journalBytes`` long (truncated, emptied, replaced), a
zero byte in the journal (nothing here ever writes one: a tail zeroed by a truncation and re-extension, or wiped),
and a journal holding records without the snapshot (deleted). A journal of a snapshot without ``journalBytes``
(an earlier version's: written full of zero bytes) is read by the earlier rule, zero bytes meaning never written.

The order of writes keeps a kill -9 at any point harmless: a journal is (re)built *before* the snapshot that
names it, holding the records the old snapshot still needs (so the old snapshot plus the new file is the same
state), and a new snapshot makes the file's old records stale by its new journal ID.

Several processes may share the files (the old and new pod of a rolling update, serialized by the DRA plugin's
file lock): :meth:`CheckpointFile.refresh` reads the records another process added since, and reloads everything
when the snapshot or the journal file was replaced. An earlier version sharing the files reads filler as the end
of its records and writes no zero byte into an existing journal; a snapshot it writes has no ``journalBytes``.

Versions. ``version`` (``"v1"``) names the layout: every driver so far refuses any other value, so it changes
only for a layout no earlier driver could read. Within it, ``formatVersion`` counts what the entries may hold, and
each driver reads every format up to its own :data:`FORMAT`:

- format 1: the entries of the first drivers;
- format 2: a request may carry ``adminAccess: true`` (a monitoring claim; drivers from 2026-12-03 on). A
  format-1 driver refuses such an entry by name (unknown field), so the files say who can read them.

The snapshot carries ``formatVersion`` (the writer's), ``minReaderVersion`` (the oldest format that reads this
file whole: 1 unless an entry needs more) and ``claimFormats`` (UID -> format, for each entry that needs more than
format 1). The rules:

- backward: a file without these fields (an earlier driver's) is read as before;
- forward: a reader ignores snapshot fields it does not know, and refuses a file whose ``minReaderVersion`` is
  above its own format with one line naming the claims that need the newer driver (:class:`CheckpointError`;
  prepares are then refused, nothing is written over the file), never a guess;
- a writer keeps ``minReaderVersion`` as low as the entries allow, and never journals an entry that needs more than
  the snapshot's ``minReaderVersion``: it writes a snapshot instead, so the snapshot always says what reads it;
- a new entry field raises :data:`FORMAT` and is written only when set (an entry without it reads as before), so a
  release one back reads every file that does not use it (``helm rollback``: docs/neuron-dra-driver.md).

Fail closed on a corrupt file for prepare (the caller refuses to guess), stay lenient for unprepare: ``load``
raises CheckpointError and the caller decides. A boot ID different from the current one means the host rebooted:
transient state (CDI specs under /var/run) is gone and must be re-created.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import secrets
import stat
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec

from accel_core.atomic import atomic_write_bytes, atomic_write_text, clean_stale_temp_files
from accel_core.hostfiles import HostValueError, read_label

CHECKPOINT_VERSION = "v1"
#: The newest entry format this code reads and writes (see the module docstring).
FORMAT = 2
#: Claims a refusal names, at most (then "and N more").
_NAMED = 8
#: Room for a few hundred prepares and unprepares between two snapshots.
JOURNAL_BYTES = 256 * 1024
#: The first read of a refresh (usually it finds nothing new: filler, or an earlier journal's record).
_REFRESH_CHUNK = 8192
_DIGEST_CHARS = 64
#: What a journal holds where nothing was written yet: lines of spaces. Never a zero byte (those mean damage), and
#: a newline in every 64 bytes, so an earlier version's reader stops at the first line that is no record of its.
FILL_LINE = b" " * 63 + b"\n"


class CheckpointError(Exception):
    """The checkpoint exists but cannot be trusted; the message names the file."""


@dataclass
class Checkpoint:
    """Prepared-claim entries keyed by claim UID; each entry is a driver-defined JSON object with a ``state``."""

    boot_id: str = ""
    claims: dict[str, dict[str, Any]] = field(default_factory=dict)


class _Record(msgspec.Struct, forbid_unknown_fields=True):
    journal: str
    seq: int
    put: dict[str, dict[str, Any]] = {}
    delete: list[str] = []


def _canonical(body: dict[str, Any]) -> str:
    return json.dumps(body, sort_keys=True, separators=(",", ":"))


def _checksum(body: dict[str, Any]) -> str:
    return hashlib.sha256(_canonical(body).encode()).hexdigest()


def encode_record(journal: str, seq: int, put: Mapping[str, dict[str, Any]], delete: Iterable[str]) -> bytes:
    """One journal line: the change as JSON, a tab, its SHA-256 in hex, a newline."""
    body = msgspec.json.encode(_Record(journal, seq, dict(put), list(delete)))
    return body + b"\t" + hashlib.sha256(body).hexdigest().encode() + b"\n"


def _valid_line(line: bytes, where: str) -> _Record | None:
    """The record a line holds when its checksum matches, else None. A line whose checksum matches but that is not
    a record (written by something else, or by a bug) is a CheckpointError."""
    body, tab, digest = line.rpartition(b"\t")
    if not tab or len(digest) != _DIGEST_CHARS or hashlib.sha256(body).hexdigest().encode() != digest:
        return None
    try:
        return msgspec.json.decode(body, type=_Record)
    except msgspec.DecodeError as exc:
        raise CheckpointError(f"journal {where} holds a record that is not a checkpoint change: {exc}") from exc


def decode_records(data: bytes, journal: str, seq: int, where: str) -> tuple[list[_Record], int]:
    """The records of ``journal`` from ``seq`` on at the start of ``data``, in order, and the bytes they take."""
    records: list[_Record] = []
    used = 0
    while True:
        end = data.find(b"\n", used)
        if end < 0:
            break
        record = _valid_line(data[used:end], where)
        if record is None or record.journal != journal or record.seq != seq:
            break
        records.append(record)
        seq += 1
        used = end + 1
    return records, used


def _damage_after(data: bytes, journal: str, seq: int, where: str) -> None:
    """CheckpointError when an intact record of ``journal`` numbered ``seq`` or later lies beyond the end of the
    readable records: then a record in between was damaged, and entries would be lost silently."""
    for line in data.split(b"\n"):
        try:
            record = _valid_line(line, where)
        except CheckpointError:
            continue
        if record is not None and record.journal == journal and record.seq >= seq:
            raise CheckpointError(f"journal {where} is damaged before its record {record.seq}; "
                                  "the prepared claims it holds cannot be trusted")


def _any_record(data: bytes, where: str) -> bool:
    """True when ``data`` holds an intact record of any journal."""
    for line in data.split(b"\n"):
        try:
            if b"\t" in line and _valid_line(line, where) is not None:
                return True
        except CheckpointError:
            return True
    return False


def _identity(st: os.stat_result) -> tuple[int, int, int, int]:
    return st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns


class CheckpointFile:
    """The snapshot ``path`` and its journal beside it (``<stem>.journal``), as one durable map of entries."""

    def __init__(self, path: Path, entry_format: Callable[[Mapping[str, Any]], int] = lambda entry: 1) -> None:
        self.path = Path(path)
        #: The format an entry needs (1 for every entry when not given).
        self.entry_format = entry_format
        self._min_format = 1  # the snapshot's minReaderVersion: a record needing more writes a snapshot
        self.journal_path = self.path.with_suffix(".journal")
        self.current = Checkpoint()
        self._journal = ""  # the journal ID the snapshot names
        self._seq = 1  # the next record's number
        self._offset = 0  # where the next record goes
        self._fd: int | None = None
        self._snapshot: tuple[int, int, int, int] | None = None
        self._journal_inode: tuple[int, int] | None = None
        self._size = 0  # the open journal's size in bytes
        self._rewrite = False  # the next change writes a snapshot (the journal is unusable until then)
        self._zero_is_damage = False  # the snapshot gives journalBytes: a zero byte in the journal is damage
        self._filled = False  # the open journal holds no zero byte (written with filler, or by no earlier version)
        #: The snapshot was written by an earlier version (no journalBytes): the owner writes a new one at start.
        self.legacy = False

    # -- reading ---------------------------------------------------------------------------------------------------
    def load(self) -> Checkpoint:
        """Read the snapshot and apply its journal (done at start, and by :meth:`refresh` after another process
        wrote a snapshot; it also removes temp files a killed writer left beside them)."""
        clean_stale_temp_files(self.path.parent)
        self.close()
        self.current, self._journal, size, self._snapshot, self._min_format = self._read_snapshot()
        self._seq, self._offset, self._rewrite = 1, 0, False
        self._zero_is_damage = size is not None
        self.legacy = self._snapshot is not None and size is None
        self._open_journal()
        where = str(self.journal_path)
        if self._journal:  # the snapshot names a journal: it must be there, whole
            if self._fd is None:
                raise CheckpointError(f"journal {where} is missing: checkpoint {self.path} names journal "
                                      f"{self._journal}; the prepared claims it held cannot be trusted")
            expected = JOURNAL_BYTES if size is None else size
            if self._size != expected:
                raise CheckpointError(f"journal {where} is {self._size} bytes, not {expected} (truncated or "
                                      "replaced); the prepared claims it held cannot be trusted")
        data = os.pread(self._fd, self._size, 0) if self._fd is not None else b""
        self._filled = b"\0" not in data
        if self._journal:
            if self._zero_is_damage and not self._filled:
                zero = data.index(0)
                raise CheckpointError(f"journal {where} holds zero bytes from offset {zero} (wiped, "
                                      "or truncated and re-extended); the prepared claims it held cannot be trusted")
            records, used = decode_records(data, self._journal, 1, where)
            _damage_after(data[used:], self._journal, 1 + len(records), where)
            self._apply(records, used)
        elif self._snapshot is None and _any_record(data, where):
            raise CheckpointError(f"checkpoint {self.path} is missing but journal {where} holds records; the "
                                  "prepared claims cannot be trusted (move both files away to start empty)")
        return self.current

    def refresh(self) -> Checkpoint | None:
        """What another process recorded since the last look: the whole new state, or None when nothing changed."""
        try:
            snapshot: tuple[int, int, int, int] | None = _identity(os.stat(self.path))
        except FileNotFoundError:
            snapshot = None
        except OSError as exc:
            raise CheckpointError(f"cannot read checkpoint {self.path}: {exc}") from exc
        if snapshot != self._snapshot or self._journal_replaced():
            return self.load()
        if self._fd is None or not self._journal:
            return None
        records: list[_Record] = []
        chunk = _REFRESH_CHUNK
        while self._offset < self._size:
            asked = min(chunk, self._size - self._offset)
            data = os.pread(self._fd, asked, self._offset)
            if self._zero_is_damage and b"\0" in data:
                return self.load()  # zeroed meanwhile: load() says so, naming the file
            found, used = decode_records(data, self._journal, self._seq, str(self.journal_path))
            at_end = self._offset + len(data) >= self._size
            self._apply(found, used)
            records += found
            rest = data[used:]
            if at_end or len(data) < asked or b"\n" in rest or not rest.strip(b"\0"):
                break  # the end of the file, a line that is not our next record, or never-written bytes
            if not found:
                chunk *= 2  # a record longer than what was read
        return self.current if records else None

    def _read_snapshot(self) -> tuple[Checkpoint, str, int | None, tuple[int, int, int, int] | None, int]:
        """The entries, the journal ID, ``journalBytes`` (None from an earlier version), the file's identity and
        its ``minReaderVersion`` (1 when not given)."""
        try:
            with open(self.path, "rb") as fh:
                raw = fh.read()
                identity = _identity(os.fstat(fh.fileno()))
        except FileNotFoundError:
            return Checkpoint(), "", None, None, 1
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
            journal = body.get("journal", "")
            if not isinstance(journal, str):
                raise CheckpointError(f"checkpoint {self.path}: 'journal' is not a string")
            size = body.get("journalBytes")
            if size is not None and (type(size) is not int or size <= 0):
                raise CheckpointError(f"checkpoint {self.path}: 'journalBytes' is not a positive integer")
            least = self._check_format(body, claims)
            return Checkpoint(boot_id=str(body.get("bootId", "")), claims=claims), journal, size, identity, least
        except CheckpointError:
            raise
        except (ValueError, KeyError, TypeError) as exc:
            raise CheckpointError(f"checkpoint {self.path} is malformed: {exc}") from exc

    def _check_format(self, body: Mapping[str, Any], claims: Mapping[str, Any]) -> int:
        """The file's ``minReaderVersion``; CheckpointError, naming the claims, when this code cannot read it."""
        least, formats = body.get("minReaderVersion", 1), body.get("claimFormats", {})
        if type(least) is not int or least < 1:
            raise CheckpointError(f"checkpoint {self.path}: 'minReaderVersion' is not a positive integer")
        if not isinstance(formats, dict) or any(type(f) is not int for f in formats.values()):
            raise CheckpointError(f"checkpoint {self.path}: 'claimFormats' is not an object of integers")
        if least <= FORMAT:
            return least
        newer = sorted(uid for uid, f in formats.items() if f > FORMAT)
        named = [_describe(uid, claims.get(uid)) for uid in newer[:_NAMED]]
        more = f" and {len(newer) - _NAMED} more" if len(newer) > _NAMED else ""
        raise CheckpointError(
            f"checkpoint {self.path} needs a newer driver (entry format {least}; this driver reads up to {FORMAT}): "
            f"claims {', '.join(named) or '(none named)'}{more}; prepares are refused and the file is left as it "
            "is: roll the driver forward again, or unprepare those claims (delete their pods) before a rollback")

    def _open_journal(self) -> None:
        """Open the journal for reading and writing (:meth:`load` judges a missing or odd-sized one; one that
        nothing refers to yet is rebuilt by the next change)."""
        self._size = 0
        try:
            fd = os.open(self.journal_path, os.O_RDWR | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
        except FileNotFoundError:
            self._rewrite = True
            return
        except OSError as exc:
            raise CheckpointError(f"cannot open journal {self.journal_path}: {exc}") from exc
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            os.close(fd)
            raise CheckpointError(f"journal {self.journal_path} is not a regular file")
        self._fd = fd
        self._journal_inode = (st.st_dev, st.st_ino)
        self._size = st.st_size
        if st.st_size != JOURNAL_BYTES:
            self._rewrite = True

    def _journal_replaced(self) -> bool:
        """True when the journal file is gone, another file, or another size (truncated or extended) since it was
        opened (the stat a refresh makes anyway)."""
        try:
            st = os.stat(self.journal_path)
        except FileNotFoundError:
            return self._fd is not None
        return (st.st_dev, st.st_ino) != self._journal_inode or st.st_size != self._size

    def _apply(self, records: list[_Record], used: int) -> None:
        for record in records:
            self.current.claims.update(record.put)
            for uid in record.delete:
                self.current.claims.pop(uid, None)
        self._seq += len(records)
        self._offset += used

    @property
    def journaled(self) -> int:
        """How many changes are in the journal only (not yet in a snapshot)."""
        return self._seq - 1

    # -- writing ---------------------------------------------------------------------------------------------------
    def record(self, put: Mapping[str, dict[str, Any]], delete: Iterable[str],
               snapshot: Callable[[], Checkpoint]) -> None:
        """Make a change durable: one journal record, or a new snapshot (``snapshot()``, the whole state after the
        change) when the journal is full or unusable. OSError propagates; the change is then not recorded."""
        delete = list(delete)
        if self._fd is None or self._rewrite or not self._journal or any(
                self.entry_format(entry) > self._min_format for entry in put.values()):
            self.save(snapshot())  # (an entry needing a newer reader than the snapshot names goes in a snapshot)
            return
        line = encode_record(self._journal, self._seq, put, delete)
        if self._offset + len(line) > min(JOURNAL_BYTES, self._size):
            self.save(snapshot())
            return
        try:
            written = os.pwrite(self._fd, line, self._offset)
            if written != len(line):
                raise OSError(f"short write to journal {self.journal_path} ({written} of {len(line)} bytes)")
            os.fdatasync(self._fd)
        except OSError:
            self._rewrite = True  # what reached the disk is unknown: the next change writes a snapshot
            raise
        self._apply([_Record(self._journal, self._seq, dict(put), delete)], len(line))

    def save(self, checkpoint: Checkpoint) -> None:
        """Write a new snapshot atomically and durably, naming a new journal (records of the old one no longer
        count) and the journal file's size. The body is serialized once, in the canonical form its checksum covers.

        A journal that is missing, unusable after a failed write, of an earlier version (zero bytes), or replaced
        is rebuilt first (:meth:`_rebuild_journal`): the snapshot never names a file that is not there yet."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if self._fd is None or self._rewrite or not self._filled or self._journal_replaced():
            self._rebuild_journal()
        journal = secrets.token_hex(8)
        formats = {uid: f for uid, entry in checkpoint.claims.items() if (f := self.entry_format(entry)) > 1}
        least = max(formats.values(), default=1)
        body = _canonical({"version": CHECKPOINT_VERSION, "formatVersion": FORMAT, "minReaderVersion": least,
                           "claimFormats": formats, "bootId": checkpoint.boot_id, "journal": journal,
                           "journalBytes": self._size, "claims": checkpoint.claims})
        checksum = hashlib.sha256(body.encode()).hexdigest()
        atomic_write_text(self.path, f'{{"body":{body},"checksum":"{checksum}"}}\n')
        self._snapshot = _identity(os.stat(self.path))
        self.current = Checkpoint(checkpoint.boot_id, dict(checkpoint.claims))
        self._journal, self._seq, self._offset = journal, 1, 0
        self._zero_is_damage, self.legacy, self._min_format = True, False, least

    def _rebuild_journal(self) -> None:
        """Replace the journal (atomically, durably) with one of JOURNAL_BYTES holding the records of the current
        journal known so far, then filler. Killed right after, the old snapshot still reads the same state from
        it; the snapshot written next makes those records stale. A record whose write failed is not kept (its
        request was not answered)."""
        keep = b""
        if self._fd is not None and self._journal and not self._journal_replaced():
            keep = os.pread(self._fd, self._offset, 0)
            if len(keep) != self._offset:
                raise OSError(f"journal {self.journal_path} is shorter than its records")
        size = max(JOURNAL_BYTES, len(keep))
        fill = FILL_LINE * (size // len(FILL_LINE) + 1)
        self.close()
        atomic_write_bytes(self.journal_path, keep + fill[len(keep):size])
        self._open_journal()
        if self._fd is None:
            raise OSError(f"journal {self.journal_path} vanished right after it was written")
        self._rewrite, self._filled = False, True

    def close(self) -> None:
        if self._fd is not None:
            with contextlib.suppress(OSError):
                os.close(self._fd)
        self._fd = None
        self._journal_inode = None


def _describe(uid: str, entry: object) -> str:
    """``namespace/name (uid U)`` of an entry that may be of any shape (cut to a readable length)."""
    names = entry if isinstance(entry, dict) else {}
    namespace, name = str(names.get("namespace", "?"))[:64], str(names.get("name", "?"))[:64]
    return f"{namespace}/{name} (uid {uid[:64]})"


def read_boot_id(host_root: Path) -> str:
    """The kernel's boot ID under the host root, or "" when it cannot be read."""
    try:
        return read_label(str(Path(host_root) / "proc/sys/kernel/random/boot_id"), "/proc/sys/kernel/random/boot_id")
    except HostValueError:
        return ""
