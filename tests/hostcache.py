"""Fake hosts built once per test session: copied per test, or shared read-only.

A trn2.48xlarge tree is ~17k entries; generating it, copying it and removing it each cost about half a CPU-second
(directory entries, not file contents, are the cost). Each kind of tree (type, EFA, LNC, UltraServer ids) is
generated once into the session's temp tree. :func:`copy_host` gives a test its own copy to mutate: an overlay
mount over the pristine tree where the tests run as root (nothing is copied until written; TESTS_NO_OVERLAY=1
turns it off), else a real copy;
:func:`shared_host` gives the pristine tree itself to a test that only reads it. A shared tree is fingerprinted
when built and checked after every test that asked for it (tests/conftest.py), so a test that changes one fails
by name instead of quietly changing what later tests see. The check is an inotify tripwire (tests/treewatch.py):
only a tree that reported a change is compared entry by entry.
"""

from __future__ import annotations

import fcntl
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

from treewatch import TreeWatch

from accel_core.fakehost import FakeHost, build_host
from accel_core.paths import HostPaths

#: Set by the session fixture in tests/conftest.py; without it (outside pytest) every call generates a tree.
ROOT: Path | None = None

Key = tuple[str, bool, int | None, str | None, int | None]
Fingerprint = dict[str, tuple[int, int, int, int]]

_BUILT: dict[Key, Path] = {}
_FINGERPRINTS: dict[Path, Fingerprint] = {}
_WATCH: TreeWatch | None = None
#: shared trees the tripwire covers (the others are compared entry by entry after every test)
_WATCHED: set[Path] = set()
#: watched trees that reported a change (compared in full from then on)
_DIRTY: set[Path] = set()
#: Shared trees handed out since the last :func:`take_shared_used` (the current test's).
_USED: set[Path] = set()
#: Copies made since the last :func:`take_copies`.
_COPIES: list[Path] = []
#: Copies that are overlay mounts, still mounted; and whether overlays can be mounted here (None: not tried yet).
_MOUNTS: list[Path] = []
_OVERLAY_OK: bool | None = None


def _pristine(key: Key) -> Path:
    """The pristine tree of ``key``, built on first use. ROOT may be shared by the xdist workers of one run: the
    first to need a tree builds it under a lock, into a temp name renamed into place when complete."""
    assert ROOT is not None
    pristine = _BUILT.get(key)
    if pristine is None:
        instance_type, efa, lnc, us_id, us_node = key
        name = "-".join(str(part) for part in key)
        pristine = ROOT / name
        with (ROOT / f".{name}.lock").open("w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if not pristine.is_dir():
                partial = ROOT / f".{name}.{os.getpid()}"
                build_host(partial, instance_type, efa=efa, lnc=lnc, ultraserver_id=us_id, ultraserver_node=us_node)
                partial.rename(pristine)
        _BUILT[key] = pristine
    return pristine


def copy_host(dest: Path, instance_type: str, *, efa: bool = True, lnc: int | None = None,
              ultraserver_id: str | None = None, ultraserver_node: int | None = None) -> FakeHost:
    """Like :func:`build_host` (same arguments and result), from the session's pristine tree of that kind."""
    if ROOT is None:
        return build_host(dest, instance_type, efa=efa, lnc=lnc, ultraserver_id=ultraserver_id,
                          ultraserver_node=ultraserver_node)
    pristine = _pristine((instance_type, efa, lnc, ultraserver_id, ultraserver_node))
    dest.mkdir(parents=True, exist_ok=True)
    if any(dest.iterdir()):
        build_host(dest, instance_type, efa=efa, lnc=lnc)  # raises the builder's "already holds a tree" error
    if not _overlay(pristine, dest):
        # Symlinks stay links and hard links stay links; modes come out as the builder made them (same umask).
        # Timestamps, owners and xattrs are not copied: nothing reads them, and skipping them is a third of the cost.
        subprocess.run(["cp", "-R", "-P", "--preserve=links", f"{pristine}/.", str(dest)], check=True)
    _COPIES.append(dest)
    return FakeHost.attach(dest)


def _overlay(pristine: Path, dest: Path) -> bool:
    """Make ``dest`` a copy-on-write view of ``pristine`` (an overlay mount: no file is copied until a test writes
    it); False where overlays cannot be mounted (not root, no overlay support), and the caller copies."""
    global _OVERLAY_OK
    if _OVERLAY_OK is False or os.environ.get("TESTS_NO_OVERLAY"):
        return False
    layers = dest.parent / f".{dest.name}.overlay"
    (layers / "upper").mkdir(parents=True)
    (layers / "work").mkdir()
    # redirect_dir: a test may rename a directory of the lower tree (a device removed, then put back)
    options = f"lowerdir={pristine},upperdir={layers / 'upper'},workdir={layers / 'work'},redirect_dir=on"
    done = subprocess.run(["mount", "-t", "overlay", "overlay", "-o", options, str(dest)], capture_output=True,
                          check=False)
    _OVERLAY_OK = done.returncode == 0
    if not _OVERLAY_OK:
        subprocess.run(["rm", "-rf", "--", str(layers)], check=False)
        return False
    _MOUNTS.append(dest)
    return True


def unmount(copies: list[Path]) -> None:
    """Unmount the overlay copies among ``copies`` (their files stay readable in their upper layers)."""
    mounted = [c for c in copies if c in _MOUNTS]
    if mounted:
        subprocess.run(["umount", "--lazy", *map(str, mounted)], check=False)
        for c in mounted:
            _MOUNTS.remove(c)


def unmount_all() -> None:
    unmount(list(_MOUNTS))


def unmount_below(directory: Path) -> None:
    """Unmount every mount below ``directory`` (what a killed run left), as /proc/self/mounts lists them."""
    try:
        lines = Path("/proc/self/mounts").read_text().splitlines()
    except OSError:
        return
    prefix = str(directory).rstrip("/") + "/"
    targets = [fields[1] for fields in (line.split() for line in lines) if len(fields) > 1
               and fields[1].startswith(prefix)]
    if targets:
        subprocess.run(["umount", "--lazy", *targets], check=False)


def shared_host(instance_type: str, *, efa: bool = True, lnc: int | None = None,
                ultraserver_id: str | None = None, ultraserver_node: int | None = None) -> FakeHost:
    """The session's pristine tree of that kind itself, for a test that only reads it (never mutate it: the test
    fails after it ran). Ask for it in the test body (a dict lookup) so the check after the test covers it."""
    if ROOT is None:
        raise RuntimeError("shared_host() needs the session fixture of tests/conftest.py")
    pristine = _pristine((instance_type, efa, lnc, ultraserver_id, ultraserver_node))
    if pristine not in _FINGERPRINTS:
        global _WATCH
        if _WATCH is None:
            _WATCH = TreeWatch()
        if _WATCH.watch(pristine):  # before the fingerprint, so nothing can slip in between
            _WATCHED.add(pristine)
        _FINGERPRINTS[pristine] = fingerprint(pristine)
    _USED.add(pristine)
    return FakeHost.attach(pristine)


def tree_entries(root: Path) -> Iterator[os.DirEntry[str]]:
    """Every entry below ``root``, directories before what they hold; no symlink is followed."""
    todo = [str(root)]
    while todo:
        with os.scandir(todo.pop()) as entries:
            for entry in entries:
                yield entry
                if entry.is_dir(follow_symlinks=False):
                    todo.append(entry.path)


def fingerprint(root: Path) -> Fingerprint:
    """Every entry below ``root`` with its type+mode, size, mtime and ctime (no symlink is followed)."""
    out: Fingerprint = {}
    for entry in tree_entries(root):
        st = entry.stat(follow_symlinks=False)
        out[entry.path] = (st.st_mode, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
    return out


def changes(root: Path) -> list[str]:
    """Paths below a shared tree that were added, removed or changed since it was built (sorted)."""
    if root in _WATCHED and _WATCH is not None:
        _DIRTY.update(_WATCH.tripped())
        if root not in _DIRTY:
            return []
    before, now = _FINGERPRINTS[root], fingerprint(root)
    return sorted(p for p in before.keys() | now.keys() if before.get(p) != now.get(p))


def take_shared_used() -> set[Path]:
    """The shared trees handed out since the last call (and forget them)."""
    used = set(_USED)
    _USED.clear()
    return used


def take_copies() -> list[Path]:
    """The copies made since the last call (and forget them)."""
    copies = list(_COPIES)
    _COPIES.clear()
    return copies


def all_shared() -> list[Path]:
    return list(_FINGERPRINTS)


def own_paths(host: FakeHost) -> HostPaths:
    """The host's paths with the kubelet directories inside the fake tree too: nothing on the machine running the
    tests (a real kubelet's sockets under /var/lib/kubelet) can change the outcome."""
    return HostPaths(host_root=host.root, kubelet_root=host.root / "kubelet", device_plugins=host.root / "dp")
