"""Small filesystem operations for the fake host: atomic writes, relative symlinks, snapshot and replay.

Every path argument is *relative to the host root* (``sys/class/...``); :func:`resolve` turns a user-supplied path
(with or without a leading ``/``) into one and refuses anything that escapes the root.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from pathlib import Path, PurePosixPath


class FakeHostError(ValueError):
    """A fake-host operation was given a bad argument (unknown device, path outside the root, ...)."""


def resolve(root: Path, relpath: str | os.PathLike[str]) -> Path:
    """``root / relpath`` for a host path such as ``/sys/class/x`` or ``sys/class/x``; never outside ``root``."""
    rel = PurePosixPath(os.fspath(relpath).lstrip("/"))
    if not rel.parts or ".." in rel.parts:
        raise FakeHostError(f"{os.fspath(relpath)!r} is not a path inside the fake host root")
    return root / rel


def write_plain(path: Path, text: str) -> None:
    """Write a file, creating parents (used while building, when nothing watches yet)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")


def write_atomic(path: Path, text: str) -> None:
    """Write through a temporary sibling and ``os.replace`` so readers see the old or the new file, never half."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


def link(path: Path, target: Path) -> None:
    """Create ``path`` as a *relative* symlink to ``target`` so the tree resolves under any root prefix."""
    path.parent.mkdir(parents=True, exist_ok=True)
    os.symlink(os.path.relpath(target, path.parent), path)


@dataclass(frozen=True)
class Entry:
    """One snapshotted node: ``kind`` is ``d`` (directory), ``f`` (file, payload = text) or ``l`` (link)."""

    rel: str
    kind: str
    payload: str = ""


def snapshot(root: Path, rel: str) -> list[Entry]:
    """Everything at and below ``rel`` (links are recorded, not followed), parents before children."""
    top = root / rel
    if top.is_symlink():
        return [Entry(rel, "l", os.readlink(top))]
    if top.is_file():
        return [Entry(rel, "f", top.read_text(encoding="utf-8"))]
    if not top.is_dir():
        return []
    entries = [Entry(rel, "d")]
    for dirpath, dirnames, filenames in os.walk(top):
        base = Path(dirpath)
        dirnames.sort()
        for name in sorted(dirnames + filenames):
            path = base / name
            sub = str(path.relative_to(root))
            if path.is_symlink():
                entries.append(Entry(sub, "l", os.readlink(path)))
            elif path.is_dir():
                entries.append(Entry(sub, "d"))
            else:
                entries.append(Entry(sub, "f", path.read_text(encoding="utf-8")))
        # os.walk does not descend into symlinked directories, which is what a snapshot wants.
    return entries


def delete(root: Path, rel: str) -> None:
    """Remove ``rel``; a directory first disappears by rename so watchers never see it half-deleted."""
    path = root / rel
    if path.is_symlink() or path.is_file():
        path.unlink()
    elif path.is_dir():
        doomed = path.with_name(f".{path.name}.removing-{os.getpid()}")
        os.rename(path, doomed)
        shutil.rmtree(doomed)


def replay(root: Path, entries: list[Entry]) -> None:
    """Re-create a snapshot. A directory tree is staged under a temporary name and renamed into place."""
    if not entries:
        return
    head = entries[0]
    if head.kind != "d":
        target = root / head.rel
        target.parent.mkdir(parents=True, exist_ok=True)
        if head.kind == "l":
            os.symlink(head.payload, target)
        else:
            write_atomic(target, head.payload)
        return
    final = root / head.rel
    final.parent.mkdir(parents=True, exist_ok=True)
    stage = final.with_name(f".{final.name}.restoring-{os.getpid()}")
    prefix = len(head.rel)
    for entry in entries:
        path = Path(str(stage) + entry.rel[prefix:])
        if entry.kind == "d":
            path.mkdir(parents=True, exist_ok=True)
        elif entry.kind == "l":
            os.symlink(entry.payload, path)
        else:
            path.write_text(entry.payload, encoding="utf-8")
    os.rename(stage, final)
