"""``FakeHost``: a handle on a generated host tree with the mutations other components' tests use.

Every mutation is atomic for a reader: files are replaced via temp + rename, removed directories vanish by rename,
restored directories are staged and renamed into place. ``remove_*`` snapshots exactly what it deletes (including
any counter you changed) and the matching ``restore_*`` puts that snapshot back.

Typical use::

    host = build_host(tmp_path, "p5.48xlarge")
    host.set_port_state("rdmap79s0", "DOWN")
    host.remove_efa("rdmap80s0"); ...; host.restore_efa("rdmap80s0")
    host.set_neuron_counter(0, "neuron_core0/stats/status/hw_error/total", 3)
"""

from __future__ import annotations

import json
from pathlib import Path

from accel_core.awsfacts import catalog, ultraserver
from accel_core.awsfacts.catalog import InstanceType
from accel_core.awsfacts.ultraserver import UltraServerIds
from accel_core.fakehost import layout
from accel_core.fakehost.fsops import Entry, FakeHostError, delete, replay, resolve, snapshot, write_atomic

MARKER = ".fake-sysfs.json"

_PORT_STATES = {
    "DOWN": ("1: DOWN", "3: Disabled"),
    "INIT": ("2: INIT", "5: LinkUp"),
    "ARMED": ("3: ARMED", "5: LinkUp"),
    "ACTIVE": ("4: ACTIVE", "5: LinkUp"),
}


class FakeHost:
    """A generated host tree for one catalog instance type. Build one with ``build_host`` or ``attach``."""

    def __init__(self, root: Path, spec: InstanceType, *, efa: bool = True) -> None:
        self._root = Path(root)
        self._spec = spec
        self._efa_attached = efa
        self._rdma = {s.ibdev: s for s in layout.rdma_slots(spec, efa=efa)}
        self._neuron = {s.index: s for s in layout.neuron_slots(spec)}
        self._removed: dict[str, list[list[Entry]]] = {}

    @classmethod
    def attach(cls, root: Path) -> FakeHost:
        """Open a tree written earlier (e.g. by the ``fake-sysfs`` CLI), using the marker file it left."""
        marker = Path(root) / MARKER
        try:
            meta = json.loads(marker.read_text(encoding="utf-8"))
            return cls(Path(root), catalog.get(str(meta["instance_type"])), efa=bool(meta["efa"]))
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise FakeHostError(f"{marker}: not a fake-sysfs tree marker ({exc})") from exc

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
    def efa_ibdevs(self) -> list[str]:
        """EFA ibdev names as built (removals do not change this list), in uverbs order."""
        return [s.ibdev for s in self._rdma.values() if s.is_efa]

    @property
    def rdma_ibdevs(self) -> list[str]:
        """All RDMA ibdev names as built, EFA and non-EFA, in uverbs order."""
        return list(self._rdma)

    @property
    def neuron_count(self) -> int:
        """Neuron devices as built (removals do not change this number)."""
        return len(self._neuron)

    @property
    def removed(self) -> list[str]:
        """Keys of what is currently removed: ``efa:<ibdev>``, ``neuron:<index>``, ``dev:<path>``."""
        return list(self._removed)

    def path(self, relpath: str) -> Path:
        """The real path of a host path such as ``/sys/class/infiniband``."""
        return resolve(self._root, relpath)

    def uverbs_of(self, ibdev: str) -> str:
        """``uverbsN`` of an RDMA device as built."""
        return self._slot(ibdev).uverbs_name

    def ibdev_dir(self, ibdev: str) -> Path:
        """The device's real sysfs directory (under its PCI function)."""
        return self._root / self._slot(ibdev).ibdev_dir

    # ------------------------------------------------------------------------------------------ EFA

    def remove_efa(self, ibdev: str) -> None:
        """Detach an EFA/RDMA device: its class links, ``/dev/infiniband/uverbsN``, bus links and PCI function."""
        self._remove(f"efa:{ibdev}", self._slot(ibdev).group())

    def restore_efa(self, ibdev: str) -> None:
        """Re-create exactly what :meth:`remove_efa` removed."""
        self._slot(ibdev)
        self._restore(f"efa:{ibdev}")

    def set_port_state(self, ibdev: str, state: str) -> None:
        """Set ``ports/1/state`` and ``phys_state``: DOWN, INIT, ARMED or ACTIVE."""
        try:
            logical, physical = _PORT_STATES[state.upper()]
        except KeyError:
            raise FakeHostError(f"port state must be one of {', '.join(_PORT_STATES)}, got {state!r}") from None
        port = f"{self._slot(ibdev).ibdev_dir}/ports/1"
        self._replace(f"{port}/state", f"{logical}\n")
        self._replace(f"{port}/phys_state", f"{physical}\n")

    def set_efa_counter(self, ibdev: str, name: str, value: int, port: int | None = None) -> None:
        """Set a ``hw_counters`` value: device scope when ``port`` is None, else ``ports/<port>/hw_counters``."""
        base = self._slot(ibdev).ibdev_dir
        rel = f"{base}/hw_counters/{name}" if port is None else f"{base}/ports/{port}/hw_counters/{name}"
        self._replace(rel, f"{int(value)}\n", what=f"counter {name!r} of {ibdev}")

    # ------------------------------------------------------------------------------------------ Neuron

    def remove_neuron(self, index: int) -> None:
        """Remove Neuron device ``index``: class link, ``/dev/neuronN``, its sysfs dir and its PCI function."""
        self._remove(f"neuron:{index}", self._nslot(index).group())

    def restore_neuron(self, index: int) -> None:
        """Re-create exactly what :meth:`remove_neuron` removed."""
        self._nslot(index)
        self._restore(f"neuron:{index}")

    def set_neuron_counter(self, index: int, relpath: str, value: int | str) -> None:
        """Set a file below ``neuronN/``, e.g. ``neuron_core0/stats/status/hw_error/total`` or
        ``stats/hardware/mem_ecc_uncorrected/total``. The file must exist."""
        rel = f"{self._nslot(index).sysfs_dir}/{relpath.strip('/')}"
        resolve(self._root, rel)
        self._replace(rel, f"{value}\n", what=f"neuron{index} attribute {relpath!r}")

    def set_ultraserver(self, ids: UltraServerIds | None) -> None:
        """Rewrite the class-level UltraServer attributes: a node's ids (``busy=True`` writes ``busy`` as the
        mode, as during an election), or None for the values of a node outside an UltraServer."""
        for name, text in ultraserver.class_files(ids).items():
            self._replace(f"sys/class/neuron_device/{name}", text, what=f"neuron class attribute {name}")

    # ------------------------------------------------------------------------------------------ generic

    def remove_dev_node(self, path: str) -> None:
        """Delete a ``/dev`` node (e.g. ``/dev/neuron3``) while sysfs stays intact."""
        rel = self._dev_rel(path)
        self._remove(f"dev:{rel}", [rel])

    def restore_dev_node(self, path: str) -> None:
        self._restore(f"dev:{self._dev_rel(path)}")

    def corrupt(self, relpath: str, text: str) -> None:
        """Overwrite an existing attribute file with arbitrary text (malformed-input tests)."""
        self._replace(str(resolve(self._root, relpath).relative_to(self._root)), text)

    def write(self, relpath: str, text: str) -> None:
        """Write any file under the root (parents are created), atomically."""
        write_atomic(resolve(self._root, relpath), text)

    def set_boot_id(self, boot_id: str) -> None:
        """Change ``/proc/sys/kernel/random/boot_id`` (simulates a reboot)."""
        self.write("proc/sys/kernel/random/boot_id", f"{boot_id.strip()}\n")

    # ------------------------------------------------------------------------------------------ internals

    def _slot(self, ibdev: str) -> layout.RdmaSlot:
        try:
            return self._rdma[ibdev]
        except KeyError:
            known = ", ".join(self._rdma) or "none"
            raise FakeHostError(f"{self.instance_type}: no RDMA device {ibdev!r} (built: {known})") from None

    def _nslot(self, index: int) -> layout.NeuronSlot:
        try:
            return self._neuron[index]
        except KeyError:
            raise FakeHostError(
                f"{self.instance_type}: no Neuron device {index} (built: {len(self._neuron)} devices)"
            ) from None

    def _dev_rel(self, path: str) -> str:
        rel = str(resolve(self._root, path).relative_to(self._root))
        if not rel.startswith("dev/"):
            raise FakeHostError(f"{path!r} is not below /dev")
        return rel

    def _replace(self, rel: str, text: str, what: str | None = None) -> None:
        target = self._root / rel
        if not target.is_file():
            label = what or f"/{rel}"
            raise FakeHostError(f"{self.instance_type}: {label} does not exist (/{rel})")
        write_atomic(target, text)

    def _remove(self, key: str, rels: list[str]) -> None:
        if key in self._removed:
            raise FakeHostError(f"{self.instance_type}: {key} is already removed")
        snaps = [snapshot(self._root, rel) for rel in rels]
        if not any(snaps):
            raise FakeHostError(f"{self.instance_type}: nothing to remove for {key}")
        for rel in rels:
            delete(self._root, rel)
        self._removed[key] = snaps

    def _restore(self, key: str) -> None:
        snaps = self._removed.pop(key, None)
        if snaps is None:
            raise FakeHostError(f"{self.instance_type}: {key} is not removed")
        for entries in reversed(snaps):  # PCI function first, entry-point links last
            replay(self._root, entries)
