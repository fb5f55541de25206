"""``FakeHost``: a handle on a generated host tree with the mutations other components' tests use.

The generic mutations are here; each accelerator's own (``set_port_state``, ``remove_neuron``...) are its part's
methods (:mod:`accel_core.fakehost.parts`), offered on the host by name. Every mutation is atomic for a reader:
files are replaced via temp + rename, removed directories vanish by rename, restored directories are staged and
renamed into place. ``remove`` snapshots exactly what it deletes (including any counter you changed) and the
matching ``restore`` puts that snapshot back. The snapshots are kept in the tree (``.fake-sysfs.removed.json``), so
a removal made by one process (the ``fake-sysfs remove`` verb) can be restored by another.

The devices a user names (``rdmap79s0``, ``neuron3``) come from the parts' :meth:`HostPart.device_names`;
:meth:`FakeHost.remove_device` / :meth:`FakeHost.restore_device` take those names, for any accelerator.

Typical use::

    host = build_host(tmp_path, "p5.48xlarge")
    host.set_port_state("rdmap79s0", "DOWN")
    host.remove_efa("rdmap80s0"); ...; host.restore_efa("rdmap80s0")
    host.set_neuron_counter(0, "neuron_core0/stats/status/hw_error/total", 3)
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from accel_core.awsfacts import catalog
from accel_core.awsfacts.catalog import InstanceType
from accel_core.fakehost.fsops import Entry, FakeHostError, delete, replay, resolve, snapshot, write_atomic
from accel_core.fakehost.parts import HostPart, part_types

MARKER = ".fake-sysfs.json"
#: what is currently removed, ``{key: [[[rel, kind, payload], ...], ...]}``; absent when nothing is
REMOVED_RECORD = ".fake-sysfs.removed.json"


class FakeHost:
    """A generated host tree for one catalog instance type. Build one with ``build_host`` or ``attach``."""

    def __init__(self, root: Path, spec: InstanceType, options: Mapping[str, Any] | None = None) -> None:
        self._root = Path(root)
        self._spec = spec
        self.parts: tuple[HostPart, ...] = tuple(part(self, spec, options or {}) for part in part_types())

    @classmethod
    def attach(cls, root: Path) -> FakeHost:
        """Open a tree written earlier (e.g. by the ``fake-sysfs`` CLI), using the marker file it left."""
        marker = Path(root) / MARKER
        try:
            meta = json.loads(marker.read_text(encoding="utf-8"))
            spec = catalog.get(str(meta.pop("instance_type")))
            return cls(Path(root), spec, dict(meta))
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
            raise FakeHostError(f"{marker}: not a fake-sysfs tree marker ({exc})") from exc

    def __getattr__(self, name: str) -> Any:
        """An accelerator part's mutation or view, e.g. ``set_port_state`` (EFA) or ``remove_neuron``."""
        if not name.startswith("_"):
            for part in self.__dict__.get("parts", ()):
                if hasattr(type(part), name):
                    return getattr(part, name)
        raise AttributeError(f"{type(self).__name__} has no attribute {name!r} (nor has any accelerator's part)")

    # ------------------------------------------------------------------------------------------ properties

    @property
    def root(self) -> Path:
        return self._root

    @property
    def instance_type(self) -> str:
        return self._spec.name

    @property
    def spec(self) -> InstanceType:
        """The catalog entry the tree was built from."""
        return self._spec

    @property
    def removed(self) -> list[str]:
        """Keys of what is currently removed: ``efa:<ibdev>``, ``neuron:<index>``, ``dev:<path>``."""
        return list(self._load_removed())

    def path(self, relpath: str) -> Path:
        """The real path of a host path such as ``/sys/class/infiniband``."""
        return resolve(self._root, relpath)

    # ------------------------------------------------------------------------------------------ generic

    def remove_dev_node(self, path: str) -> None:
        """Delete a ``/dev`` node (e.g. ``/dev/neuron3``) while sysfs stays intact."""
        rel = self._dev_rel(path)
        self.remove(f"dev:{rel}", [rel])

    def restore_dev_node(self, path: str) -> None:
        self.restore(f"dev:{self._dev_rel(path)}")

    def corrupt(self, relpath: str, text: str) -> None:
        """Overwrite an existing attribute file with arbitrary text (malformed-input tests)."""
        self.replace(str(resolve(self._root, relpath).relative_to(self._root)), text)

    def write(self, relpath: str, text: str) -> None:
        """Write any file under the root (parents are created), atomically."""
        write_atomic(resolve(self._root, relpath), text)

    def set_boot_id(self, boot_id: str) -> None:
        """Change ``/proc/sys/kernel/random/boot_id`` (simulates a reboot)."""
        self.write("proc/sys/kernel/random/boot_id", f"{boot_id.strip()}\n")

    def replace(self, rel: str, text: str, what: str | None = None) -> None:
        """Replace an existing file (``rel`` below the root) atomically; ``what`` names it in the error."""
        target = self._root / rel
        if not target.is_file():
            label = what or f"/{rel}"
            raise FakeHostError(f"{self.instance_type}: {label} does not exist (/{rel})")
        write_atomic(target, text)

    def remove(self, key: str, rels: list[str]) -> None:
        """Remove ``rels`` (in order) as one removal named ``key``, remembering them for :meth:`restore`."""
        with self._record_lock():
            self._remove(key, rels)

    def restore(self, key: str) -> None:
        """Put back what :meth:`remove` removed under ``key``."""
        with self._record_lock():
            self._restore(key)

    def _remove(self, key: str, rels: list[str]) -> None:
        removed = self._load_removed()
        if key in removed:
            raise FakeHostError(f"{self.instance_type}: {key} is already removed")
        snaps = [snapshot(self._root, rel) for rel in rels]
        if not any(snaps):
            raise FakeHostError(f"{self.instance_type}: nothing to remove for {key}")
        removed[key] = snaps
        self._save_removed(removed)  # recorded first: a removal cut short can still be restored
        for rel in rels:
            delete(self._root, rel)

    def _restore(self, key: str) -> None:
        removed = self._load_removed()
        snaps = removed.pop(key, None)
        if snaps is None:
            raise FakeHostError(f"{self.instance_type}: {key} is not removed")
        for entries in reversed(snaps):  # PCI function first, entry-point links last
            if entries and not os.path.lexists(self._root / entries[0].rel):  # not already back
                replay(self._root, entries)
        self._save_removed(removed)

    # ------------------------------------------------------------------------------------------ devices by name

    def devices(self) -> dict[str, HostPart]:
        """Every device a user can name (``rdmap79s0``, ``neuron3``...) as built, with the part that owns it."""
        return {name: part for part in self.parts for name in part.device_names()}

    def part_of(self, device: str) -> HostPart:
        """The part owning ``device``; the error names the device and lists the valid ones."""
        part = self.devices().get(device)
        if part is None:
            raise FakeHostError(f"{self.instance_type} has no device {device!r}; {self.device_listing()}")
        return part

    def device_listing(self) -> str:
        """``devices: EFA rdmap79s0, ...; Neuron neuron0, ...`` (or ``no devices``), for error messages."""
        groups: dict[str, list[str]] = {}
        for name, part in self.devices().items():
            groups.setdefault(part.device_kind(name), []).append(name)
        listing = "; ".join(f"{kind} {', '.join(names)}" for kind, names in groups.items())
        return f"devices: {listing}" if groups else "it has no devices"

    def removed_parts(self, device: str) -> list[str]:
        """What of ``device`` is removed now: ``device`` (the whole device) and/or ``dev node``."""
        part = self.part_of(device)
        removed = self._load_removed()
        out = ["device"] if part.removal_key(device) in removed else []
        return out + (["dev node"] if f"dev:{self._dev_rel(part.dev_node(device))}" in removed else [])

    def remove_device(self, device: str, *, dev_node_only: bool = False) -> None:
        """Remove a named device as its driver losing it would (or only its ``/dev`` node, sysfs intact)."""
        part = self.part_of(device)
        gone = self.removed_parts(device)
        if gone:
            raise FakeHostError(f"{removed_phrase(device, gone)} already; restore it first")
        if dev_node_only:
            self.remove_dev_node(part.dev_node(device))
        else:
            part.remove_device(device)

    def restore_device(self, device: str) -> None:
        """Put back whatever of ``device`` is removed (the device, its ``/dev`` node, or both)."""
        part = self.part_of(device)
        gone = self.removed_parts(device)
        if not gone:
            raise FakeHostError(f"{device} is not removed; nothing to restore")
        if "device" in gone:
            part.restore_device(device)
        if "dev node" in gone:
            self.restore_dev_node(part.dev_node(device))

    # ------------------------------------------------------------------------------------------ internals

    @contextlib.contextmanager
    def _record_lock(self) -> Iterator[None]:
        """Two processes (``fake-sysfs remove`` in two shells) update the removal record one at a time: an
        exclusive ``flock`` on the tree's marker (no file is added to the tree for it)."""
        try:
            fd = os.open(self._root / MARKER, os.O_RDONLY)
        except FileNotFoundError:  # a tree without a marker: nobody else can attach to it
            yield
            return
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)

    def _load_removed(self) -> dict[str, list[list[Entry]]]:
        path = self._root / REMOVED_RECORD
        try:
            raw = json.loads(path.read_text(encoding="utf-8"))
            return {str(key): [[Entry(str(rel), str(kind), str(payload)) for rel, kind, payload in snap]
                               for snap in snaps] for key, snaps in raw.items()}
        except FileNotFoundError:
            return {}
        except (OSError, ValueError, TypeError, AttributeError) as exc:
            raise FakeHostError(f"{path}: not a fake-sysfs removal record ({exc})") from exc

    def _save_removed(self, removed: dict[str, list[list[Entry]]]) -> None:
        path = self._root / REMOVED_RECORD
        if not removed:
            path.unlink(missing_ok=True)
            return
        raw = {key: [[[e.rel, e.kind, e.payload] for e in snap] for snap in snaps] for key, snaps in removed.items()}
        write_atomic(path, json.dumps(raw) + "\n")

    def _dev_rel(self, path: str) -> str:
        rel = str(resolve(self._root, path).relative_to(self._root))
        if not rel.startswith("dev/"):
            raise FakeHostError(f"{path!r} is not below /dev")
        return rel


def removed_phrase(device: str, gone: list[str]) -> str:
    """``neuron3 is removed``, ``neuron3's /dev node is removed`` (``gone`` from :meth:`FakeHost.removed_parts`)."""
    if gone == ["dev node"]:
        return f"{device}'s /dev node is removed"
    return f"{device} is removed" if gone == ["device"] else f"{device} and its /dev node are removed"
