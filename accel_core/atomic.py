"""Crash-safe file writes: temp file in the same directory, fsync, rename, fsync the directory.

A writer killed between creating its temp file and the rename (kill -9, OOM, power loss) leaves
``.tmp-<name>-<random>`` behind. :func:`clean_stale_temp_files` removes those, and only those: names of exactly our
pattern, regular files, and only when no live writer holds them. A writer holds an exclusive ``flock`` on its
temp file from creation to rename, so another daemon instance writing the same directory (a rolling update) never
loses its file. The first write into a directory by a process cleans that directory once; daemons may also call
:func:`clean_stale_temp_files` at start for the directories they own.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import logging
import os
import re
import stat
import tempfile
import threading
from pathlib import Path

from accel_core.logs import kv

log = logging.getLogger(__name__)

TEMP_PREFIX = ".tmp-"
#: ``tempfile.mkstemp`` appends eight characters of this alphabet
_TEMP_NAME = re.compile(r"\.tmp-.+-[a-z0-9_]{8}", re.ASCII | re.DOTALL)

_cleaned: set[str] = set()
_cleaned_lock = threading.Lock()


def is_temp_name(name: str) -> bool:
    """True for a name :func:`atomic_write_text` could have made."""
    return _TEMP_NAME.fullmatch(name) is not None


def atomic_write_bytes(path: Path, data: bytes, *, mode: int = 0o600) -> None:
    """:func:`atomic_write_text` for bytes, durable (the file and its directory synced)."""
    atomic_write_text(path, data, mode=mode)


def atomic_write_text(path: Path, text: str | bytes, *, mode: int = 0o600, sync_dir: bool = True,
                      durable: bool = True) -> None:
    """Replace ``path`` with ``text`` so that readers see the old or the new content, never a mix.

    ``sync_dir=False`` skips the directory sync that makes the rename durable: the caller then calls
    :func:`fsync_dir` once after several writes to one directory. ``durable=False`` skips both syncs: still
    atomic for readers and across a killed process, but a power loss may lose the file (for files the caller can
    re-create from a durable source, such as CDI specs from the checkpoint)."""
    path = Path(path)
    _clean_once(path.parent)
    fd, tmp = _locked_temp(path)
    try:
        with os.fdopen(fd, "wb" if isinstance(text, bytes) else "w") as fh:
            fh.write(text)
            fh.flush()
            if durable:
                os.fsync(fh.fileno())
            os.chmod(tmp, mode)
            os.replace(tmp, path)  # still holding the lock: nobody can take the file for a leftover
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    if sync_dir and durable:
        fsync_dir(path.parent)


def fsync_dir(directory: Path) -> None:
    """Make the entries (renames, removals) of ``directory`` durable."""
    dir_fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def _locked_temp(path: Path) -> tuple[int, str]:
    """A new temp file next to ``path``, exclusively locked, and still ours (a cleaner may have removed it between
    the create and the lock: then make another)."""
    for _ in range(5):
        fd, tmp = tempfile.mkstemp(prefix=f"{TEMP_PREFIX}{path.name}-", dir=path.parent)
        fcntl.flock(fd, fcntl.LOCK_EX)
        try:
            same = os.path.samestat(os.fstat(fd), os.lstat(tmp))
        except FileNotFoundError:
            same = False
        if same:
            return fd, tmp
        os.close(fd)
    raise OSError(errno.EAGAIN, f"could not keep a temp file next to {path}")


def clean_stale_temp_files(directory: Path) -> list[Path]:
    """Remove temp files that a killed :func:`atomic_write_text` left in ``directory``; returns what went.

    Only names of our exact pattern, only regular files (never a link, directory or FIFO), and only those no
    process holds locked. Never raises for the directory's contents; a missing directory has nothing to clean.
    """
    removed: list[Path] = []
    try:
        names = [n for n in os.listdir(directory) if is_temp_name(n)]
    except OSError:
        return removed
    for name in names:
        path = Path(directory) / name
        if _remove_if_stale(path):
            removed.append(path)
    if removed:
        log.info("removed temp files left by an interrupted write", extra=kv(directory=str(directory),
                                                                             files=len(removed)))
    return removed


def _remove_if_stale(path: Path) -> bool:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return False  # gone meanwhile, a symlink (ELOOP), or unreadable: not ours to judge
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            return False
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            return False  # a live writer holds it
        try:
            if not os.path.samestat(st, os.lstat(path)):
                return False  # renamed into place and replaced meanwhile
        except FileNotFoundError:
            return False
        os.unlink(path)
        return True
    except OSError:
        return False
    finally:
        os.close(fd)


def _clean_once(directory: Path) -> None:
    key = os.path.abspath(directory)
    with _cleaned_lock:
        if key in _cleaned:
            return
        _cleaned.add(key)
    clean_stale_temp_files(directory)


def create_file(path: Path, data: bytes) -> bool:
    """Create ``path`` holding ``data`` (mode 0644); False when it already exists. A failed write removes it."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
    except FileExistsError:
        return False
    try:
        os.fchmod(fd, 0o644)  # whatever the umask
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
    except BaseException:
        os.close(fd)
        with contextlib.suppress(OSError):
            os.unlink(path)
        raise
    os.close(fd)
    return True
