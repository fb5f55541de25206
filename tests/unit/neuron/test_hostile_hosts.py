"""Property-based tests (Hypothesis) over hostile host trees (issue 14, "Tests that stay").

Each example copies a pristine fake host (built once per session) and applies a few random mutations anywhere below
``/sys``, ``/dev`` and ``/opt``: garbage, empty, huge and non-UTF-8 contents, numbers with odd digits, files
replaced by directories and back, missing entries, symlink loops, FIFOs, links to ``/dev/zero``, and entries copied
or renamed to names with odd digits. Then every ``ls`` and ``slices`` command and the discovery, policies, metrics
and ResourceSlice building the daemons run must:

- finish (a FIFO or a symlink loop must not hang them; pytest-timeout would fail the test) without raising or
  logging a traceback, and print output that encodes;
- keep every device whose own files were not touched exactly as it was (errors stay per device);
- build only ResourceSlices that pass the API's limits (a host file never stops the whole pool from publishing).
"""

from __future__ import annotations

import contextlib
import io
import json
import logging
import os
import re
import shutil
import subprocess
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import hostcache
import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import Metric
from prometheus_client.registry import Collector

from accel_core.dra.profile import tainted
from accel_core.dra.publisher import build_slices
from accel_core.dra.slicemodel import validate_devices
from accel_core.paths import HostPaths
from efa_plugin import cli as efa_cli
from efa_plugin.discovery import EfaInventory
from efa_plugin.discovery import discover as discover_efa
from efa_plugin.metrics import EfaMetrics
from efa_plugin.policy import EfaPolicy
from neuron_dra import DRA_DRIVER_NAME as NEURON_DRA
from neuron_dra.deviceplugin import cli as neuron_cli
from neuron_dra.deviceplugin.metrics import NeuronMetrics
from neuron_dra.deviceplugin.node import NeuronNode
from neuron_dra.deviceplugin.policy import NeuronCorePolicy, NeuronDevicePolicy
from neuron_dra.discovery import NeuronInventory
from neuron_dra.discovery import discover as discover_neuron
from neuron_dra.dra import cli as dra_cli
from neuron_dra.dra.attributes import device_name, slice_devices
from neuron_dra.health_rule import assess

EFA_HOST = "p4d.24xlarge"  # 4 EFAs next to 8 GPUs
NEURON_HOST = "trn1.32xlarge"  # 16 Neuron devices on a 4x4 torus, 8 EFAs mapped to them
ODD_DIGITS = ["²", "１", "٣", "𝟘", "৪", "⑦", "\u2003", "+", "_", "-"]
#: more examples for a deeper local run: ACCEL_HYPOTHESIS_SCALE=20 pytest tests/unit/neuron/test_hostile_hosts.py
SCALE = float(os.environ.get("ACCEL_HYPOTHESIS_SCALE", "1"))
GLOBAL_FILES = ("sys/class/dmi", "sys/devices/virtual/dmi", "opt/aws", "sys/module/neuron")

# -- mutations ------------------------------------------------------------------------------------------------------

numbers = st.integers(min_value=-(2**70), max_value=2**70).map(lambda n: f"{n}\n".encode())
odd_numbers = st.tuples(st.sampled_from(ODD_DIGITS), st.integers(0, 99)).map(
    lambda t: st_join(t[0], t[1]).encode())
contents = st.one_of(
    st.binary(max_size=48),
    st.just(b""),
    st.just(b"\n"),
    st.binary(min_size=4097, max_size=4200),  # larger than a sysfs page
    st.sampled_from([b"\xff\xfe\x00", b"4: ACTIVE\xff\n", b"0x1d0f\xff", "１\n".encode(), "²".encode(),
                     b" 1 2 ", b"\t\t8\t", "\u00a01\n".encode(), b"1_000\n", b"-1\n", b"0x\n", b"231:", b":"]),
    numbers,
    odd_numbers,
    st.text(max_size=40).map(str.encode),
)


def st_join(odd: str, n: int) -> str:
    return f"{n}{odd}\n" if n % 2 else f"{odd}{n}\n"


@dataclass(frozen=True)
class Mutation:
    kind: str
    rel: str
    payload: bytes = b""

    def __str__(self) -> str:  # shown by Hypothesis for a failing example
        return f"{self.kind} /{self.rel} {self.payload[:20]!r}"


KINDS = ("write", "write", "write", "remove", "dir_for_file", "loop", "fifo", "devzero", "rename_odd", "clone_odd")


SUPERSCRIPT = "⁰¹²³⁴⁵⁶⁷⁸⁹"


def oddify(name: str, style: int) -> str:
    """A look-alike of ``name`` whose digits ``isdigit()`` accepts but are not ASCII."""
    digits = {
        0: lambda d: chr(0xFF10 + d),  # full-width
        1: lambda d: SUPERSCRIPT[d],
        2: lambda d: chr(0x0660 + d),  # Arabic-Indic
    }
    if style in digits and re.search(r"[0-9]", name):
        return re.sub(r"[0-9]", lambda m: digits[style](int(m.group())), name)
    return "²" if style == 4 else name + "²"


def apply(root: Path, m: Mutation) -> None:
    """Apply ``m`` if it can be (an earlier mutation may have removed or replaced what it names)."""
    with contextlib.suppress(OSError):
        _apply(root, m)


def _apply(root: Path, m: Mutation) -> None:
    path = root / m.rel
    if m.kind in ("rename_odd", "clone_odd"):
        if not os.path.lexists(path):
            return
        twin = path.with_name(oddify(path.name, m.payload[0] % 5 if m.payload else 0))
        if os.path.lexists(twin):
            return
        if m.kind == "rename_odd":
            os.rename(path, twin)
        elif path.is_symlink():
            os.symlink(os.readlink(path), twin)
        elif path.is_dir():
            shutil.copytree(path, twin, symlinks=True)
        else:
            shutil.copy2(path, twin)
        return
    if not path.parent.is_dir() or path.parent.is_symlink():
        return  # below something an earlier mutation replaced
    if path.is_symlink() or (os.path.lexists(path) and not path.is_dir()):
        path.unlink()
    elif path.is_dir():
        shutil.rmtree(path)
    if m.kind == "write":
        path.write_bytes(m.payload)
    elif m.kind == "dir_for_file":
        path.mkdir()
        (path / "1").write_text("1\n")
    elif m.kind == "loop":
        os.symlink(path.name, path)  # a link to itself: ELOOP
    elif m.kind == "fifo":
        os.mkfifo(path)
    elif m.kind == "devzero":
        os.symlink("/dev/zero", path)


def candidates(root: Path) -> list[str]:
    """Every entry below sys/, dev/ and opt/ of a pristine tree (relative paths, sorted)."""
    out = []
    for top in ("sys", "dev", "opt"):
        for dirpath, dirnames, filenames in os.walk(root / top):
            for name in dirnames + filenames:
                out.append(str((Path(dirpath) / name).relative_to(root)))
    return sorted(out)


def mutations(paths: list[str]) -> st.SearchStrategy[list[Mutation]]:
    one = st.builds(Mutation, st.sampled_from(KINDS), st.sampled_from(paths), contents)
    return st.lists(one, min_size=1, max_size=4)


# -- fixtures -------------------------------------------------------------------------------------------------------


@dataclass
class Pristine:
    root: Path
    paths: list[str]
    efa: EfaInventory
    neuron: NeuronInventory


_PRISTINE: dict[str, Pristine] = {}


@pytest.fixture(scope="session")
def pristine(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], Pristine]:
    """Each host type built once per session (the read-only trees of tests/hostcache.py)."""
    global _WORK_BASE
    _WORK_BASE = tmp_path_factory.mktemp("hostile-work")  # removed with the session's temp tree

    def get(instance_type: str) -> Pristine:
        if instance_type not in _PRISTINE:
            root = hostcache.shared_host(instance_type).root
            hp = HostPaths(host_root=root)
            _PRISTINE[instance_type] = Pristine(root, candidates(root), discover_efa(hp), discover_neuron(hp))
        return _PRISTINE[instance_type]

    return get


def touched_paths(m: Mutation) -> list[str]:
    """What applying ``m`` can change: its path, and for a rename or clone the twin it makes."""
    if m.kind not in ("rename_odd", "clone_odd"):
        return [m.rel]
    rel = Path(m.rel)
    return [m.rel, str(rel.with_name(oddify(rel.name, m.payload[0] % 5 if m.payload else 0)))]


Shape = dict[str, tuple[int, int, int, str]]


def shape(root: Path) -> Shape:
    """Each entry's type+mode, size, file mtime and link target: what tells a tree apart from its pristine copy
    (restored files keep the pristine mtime, so a change the undo missed shows)."""
    out: Shape = {}
    for e in hostcache.tree_entries(root):
        st = e.stat(follow_symlinks=False)
        link = os.readlink(e.path) if e.is_symlink() else ""
        is_file = e.is_file(follow_symlinks=False)
        out[e.path[len(str(root)):]] = (st.st_mode, st.st_size if is_file else 0, st.st_mtime_ns if is_file else 0,
                                         link)
    return out


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    elif os.path.lexists(path):
        path.unlink()


def _restore(pristine_root: Path, root: Path, rels: list[str]) -> None:
    """Put back each path (shallowest first) as the pristine tree has it."""
    for rel in sorted(set(rels), key=lambda r: (r.count("/"), r)):
        src, dst = pristine_root / rel, root / rel
        with contextlib.suppress(OSError):
            _remove(dst)
            if src.is_symlink():
                os.symlink(os.readlink(src), dst)
            elif src.is_dir():
                shutil.copytree(src, dst, symlinks=True)
            elif src.exists():
                shutil.copy2(src, dst)


_WORK: dict[Path, tuple[Path, Shape]] = {}
_WORK_BASE: Path | None = None


@contextlib.contextmanager
def mutated_copy(base: Pristine, muts: list[Mutation]) -> Iterator[Path]:
    """The pristine tree with ``muts`` applied. One working copy per tree and worker: after each example the
    touched paths are restored and the copy's shape compared with the pristine one (a full re-copy if they differ),
    so every example starts from the pristine tree without copying ~6k entries each time."""
    if base.root not in _WORK:
        assert _WORK_BASE is not None, "mutated_copy needs the pristine fixture"
        work = Path(tempfile.mkdtemp(prefix="hostile-", dir=_WORK_BASE))
        subprocess.run(["cp", "-a", str(base.root), str(work / "host")], check=True)
        _WORK[base.root] = (work / "host", shape(base.root))
    root, want = _WORK[base.root]
    try:
        for m in muts:
            apply(root, m)
        yield root
    finally:
        _restore(base.root, root, [rel for m in muts for rel in touched_paths(m)])
        if shape(root) != want:  # something the undo did not cover: start from a fresh copy
            shutil.rmtree(root, ignore_errors=True)
            subprocess.run(["cp", "-a", str(base.root), str(root)], check=True)


class Tracebacks(logging.Handler):
    """Collects log records that carry a traceback."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        if record.exc_info:
            self.records.append(record)


@contextlib.contextmanager
def no_tracebacks() -> Iterator[None]:
    handler = Tracebacks()
    root = logging.getLogger()
    root.addHandler(handler)
    try:
        yield
    finally:
        root.removeHandler(handler)
    assert not handler.records, [h.getMessage() for h in handler.records]


def run_cli(main: Callable[[list[str]], int], argv: list[str]) -> str:
    """Run a CLI in-process with a strict UTF-8 stdout (like a pipe); returns what it printed."""
    buffer = io.BytesIO()
    out = io.TextIOWrapper(buffer, encoding="utf-8", errors="strict")
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
        assert main(argv) == 0
        out.flush()
    return buffer.getvalue().decode("utf-8")


def touched(muts: list[Mutation], footprint: list[str]) -> bool:
    for m in muts:
        if m.rel.startswith(GLOBAL_FILES):
            return True
        for own in footprint:
            if m.rel == own or m.rel.startswith(own + "/") or own.startswith(m.rel + "/"):
                return True
    return False


def exposition(produce: Callable[[], Iterator[Metric] | list[Metric]]) -> bytes:
    families = list(produce())

    class Once(Collector):
        def collect(self) -> list[Metric]:
            return families

    registry = CollectorRegistry()
    registry.register(Once())
    return generate_latest(registry)


# -- EFA ------------------------------------------------------------------------------------------------------------


def efa_footprint(base: Pristine, index: int) -> list[str]:
    dev = base.efa.devices[index]
    ib_dir = str(dev.sysfs_dir.relative_to(base.root))
    pci_dir = str(Path(os.path.realpath(dev.sysfs_dir / "device")).relative_to(base.root))
    return [f"sys/class/infiniband_verbs/{dev.uverbs}", f"sys/class/infiniband/{dev.ibdev}", ib_dir, pci_dir,
            f"dev/infiniband/{dev.uverbs}", f"sys/bus/pci/devices/{dev.pci_address}"]


def check_efa(base: Pristine, root: Path, muts: list[Mutation]) -> None:
    paths = HostPaths(host_root=root)
    with no_tracebacks():
        inv = discover_efa(paths)
        policy = EfaPolicy(paths)
        policy.rediscover()
        assert [d.id for d in policy.devices()] == [d.id for d in inv.devices]
        exposition(EfaMetrics(policy))
    document = json.loads(run_cli(efa_cli.main, ["ls", "--host-root", str(root), "--output", "json"]))
    assert document["resources"]["vpc.amazonaws.com/efa"] == len(inv.devices)
    run_cli(efa_cli.main, ["ls", "--host-root", str(root)])
    found = {d.id: d.as_dict() for d in inv.devices}
    for i, dev in enumerate(base.efa.devices):
        if not touched(muts, efa_footprint(base, i)):
            assert {**found.get(dev.id, {}), "near_gpus": None} == {**dev.as_dict(), "near_gpus": None}, dev.id


@settings(max_examples=int(60 * SCALE), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
@pytest.mark.timeout(300 * SCALE)
def test_efa_on_a_hostile_host(pristine: Callable[[str], Pristine], data: st.DataObject) -> None:
    base = pristine(EFA_HOST)
    assert len(base.efa.devices) == 4 and all(d.healthy for d in base.efa.devices)
    muts = data.draw(mutations(base.paths), label="mutations")
    with mutated_copy(base, muts) as root:
        check_efa(base, root, muts)


# -- Neuron ---------------------------------------------------------------------------------------------------------


def neuron_footprint(base: Pristine, index: int) -> list[str]:
    dev = base.neuron.device(index)
    link = base.root / f"sys/class/neuron_device/neuron{index}"
    own = [f"sys/class/neuron_device/neuron{index}", str(Path(os.path.realpath(link)).relative_to(base.root)),
           f"dev/neuron{index}"]
    if dev.pci_address:
        bus = base.root / f"sys/bus/pci/devices/{dev.pci_address}"
        own += [f"sys/bus/pci/devices/{dev.pci_address}", str(Path(os.path.realpath(bus)).relative_to(base.root))]
    return own


def check_neuron(base: Pristine, root: Path, muts: list[Mutation]) -> None:
    paths = HostPaths(host_root=root, kubelet_root=root / "no-kubelet")
    with no_tracebacks():
        inv = discover_neuron(paths)
        node = NeuronNode(paths)
        node.rediscover()
        NeuronDevicePolicy(node).devices()
        NeuronCorePolicy(node).devices()
        exposition(NeuronMetrics(node).produce)
        devices = tainted(NEURON_DRA, slice_devices(inv, "0.1.0"),  # as the service publishes them
                          {device_name(i): h for i, h in assess(inv).items()})
        validate_devices(devices)  # a host file never makes the pool unpublishable
        json.dumps([s.to_dict() for s in build_slices("neuron.aws.com", "node-1", devices)])
        discover_efa(paths)  # the EFA plugin runs on Trainium nodes too
    report = json.loads(run_cli(neuron_cli.main, ["ls", "--host-root", str(root), "--output", "json"]))
    assert report["resources"]["aws.amazon.com/neuron"] == len(inv.devices)
    run_cli(neuron_cli.main, ["ls", "--host-root", str(root)])
    slices = json.loads(run_cli(dra_cli.main, ["slices", "--host-root", str(root), "--node-name", "node-1"]))
    assert sum(len(s["spec"]["devices"]) for s in slices) == len(inv.devices)
    yaml.safe_load(run_cli(dra_cli.main, ["slices", "--host-root", str(root), "--node-name", "node-1", "-o", "yaml"]))
    run_cli(efa_cli.main, ["ls", "--host-root", str(root), "--output", "json"])
    assert len(inv.devices) >= 16  # the catalog keeps every device of the instance type listed
    for dev in base.neuron.devices:
        if touched(muts, neuron_footprint(base, dev.index)):
            continue
        now = inv.device(dev.index)
        assert now.present and now.problems == dev.problems, (dev.index, now.problems)
        assert (now.connected, now.core_count, now.pci_address, now.numa_node) == (
            dev.connected, dev.core_count, dev.pci_address, dev.numa_node)


@settings(max_examples=int(25 * SCALE), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
@pytest.mark.timeout(300 * SCALE)
def test_neuron_on_a_hostile_host(pristine: Callable[[str], Pristine], data: st.DataObject) -> None:
    base = pristine(NEURON_HOST)
    assert len(base.neuron.devices) == 16 and not base.neuron.all_problems()
    muts = data.draw(mutations(base.paths), label="mutations")
    with mutated_copy(base, muts) as root:
        check_neuron(base, root, muts)


# -- the cases the issue reported, kept as fixed examples -----------------------------------------------------------


@pytest.mark.parametrize(("instance_type", "muts"), [
    (EFA_HOST, [Mutation("clone_odd", "sys/devices/pci0000:10/0000:10:1b.0/infiniband/rdmap16s27/ports/1",
                         bytes([4]))]),  # a port directory named "²"
    (NEURON_HOST, [Mutation("write", "sys/devices/virtual/neuron_device/neuron3/core_count", "²".encode())]),
    (NEURON_HOST, [Mutation("fifo", "sys/devices/virtual/neuron_device/neuron0/connected_devices")]),
    (EFA_HOST, [Mutation("loop", "sys/class/infiniband_verbs/uverbs1/ibdev")]),
])
@pytest.mark.timeout(60)
def test_reported_cases(pristine: Callable[[str], Pristine], instance_type: str, muts: list[Mutation]) -> None:
    base = pristine(instance_type)
    for m in muts:
        assert (base.root / m.rel).exists() or (base.root / m.rel).is_symlink(), m.rel  # the tree has this path
    with mutated_copy(base, muts) as root:
        (check_efa if instance_type == EFA_HOST else check_neuron)(base, root, muts)
