"""Fixtures for end-to-end tests against the real Kubernetes control plane on 127.0.0.1: a plugin that
tests/conftest.py loads, so the product's e2e tests (tests/e2e) and the rig's own (tests/rig/e2e) share them.

- ``kube_binaries`` (session): the binaries directory.
- ``control_plane`` (session): etcd + kube-apiserver + kube-scheduler + kube-controller-manager.
- ``kube_client`` (session): a lightkube ``Client`` with the admin kubeconfig.
- ``namespace``: a fresh namespace whose ``default`` ServiceAccount exists (so Pods are admitted).
- ``fake_node``: factory for Nodes that look Ready with cpu/memory/pods capacity (no kubelet behind them).
- ``kube_cleanup``: register objects to delete after the test.
- ``wait`` and ``new_name``: the ``wait_until`` and ``unique_name`` helpers below.
- ``kubelet_node``: factory for REAL kubelet nodes (the upstream kubelet with the fake CRI runtime, on a fake host of
  an instance type), Ready and registered; stopped and deleted after the test.
- ``daemon``: factory that runs one of our console-script daemons as a subprocess; SIGTERMed after the test.

The binaries are built once by ``scripts/build-kube.sh`` if they are missing (before the first test, so
the per-test timeout does not apply to the long first build). When a test fails, the tail of each
component's log is added to its report.
"""

from __future__ import annotations

import contextlib
import fcntl
import itertools
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Callable, Generator, Iterator, Mapping
from dataclasses import dataclass
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any

import pytest
from accel_rig.containerdnode import RuntimeBinaries
from accel_rig.controlplane import ControlPlane
from accel_rig.kubeletnode import KubeletNode
from accel_rig.kubeversions import build_script, kube_bin_dir, kube_cache_root, missing_binaries
from accel_rig.nodelayout import CONTAINERD
from accel_rig.polling import poll_until
from lightkube import ApiError, Client, KubeConfig
from lightkube.core.resource import GlobalResource, NamespacedResource
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.core_v1 import Namespace, Node, Pod, ServiceAccount

from accel_core.fakehost import FakeHost, build_host

_ACTIVE: list[ControlPlane] = []
_NODES: list[KubeletNode] = []
_DAEMON_LOGS: list[Path] = []
_NAMES = itertools.count(1)
BUILD_TIMEOUT_S = 3 * 3600


def _uses_control_plane(item: pytest.Item) -> bool:
    names = getattr(item, "fixturenames", ())
    return "control_plane" in names or "kube_binaries" in names


def _runtime_gate(items: list[pytest.Item]) -> None:
    """Tests marked ``containerd`` need the real runtime and the images (``make image``). Without them they are
    skipped with a message naming what is missing, except in CI (``CI`` set), where that is an error."""
    wanted = [i for i in items if i.get_closest_marker("containerd")]
    missing = RuntimeBinaries.default().missing() if wanted else []
    if not RuntimeBinaries.default().app_image_built() and wanted:
        missing.append("the project image (make image)")
    if not missing:
        return
    if os.environ.get("CI"):
        raise pytest.UsageError("the containerd tests need: " + "; ".join(missing))
    skip = pytest.mark.skip(reason="needs the containerd runtime: missing " + "; ".join(missing))
    for item in wanted:
        item.add_marker(skip)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Build the binaries before the first test that needs them, if they are not cached yet (never for
    ``--collect-only``, which runs nothing)."""
    _runtime_gate(items)
    if config.option.collectonly or not any(_uses_control_plane(i) for i in items):
        return
    bin_dir = kube_bin_dir()
    if not missing_binaries(bin_dir):
        return
    if os.environ.get("ACCEL_KUBE_BIN"):
        raise pytest.UsageError(
            f"ACCEL_KUBE_BIN={bin_dir} lacks {', '.join(missing_binaries(bin_dir))}; unset it to build them"
        )
    root = kube_cache_root()
    root.mkdir(parents=True, exist_ok=True)
    capman = config.pluginmanager.getplugin("capturemanager")
    show = capman.global_and_fixture_disabled() if capman is not None else contextlib.nullcontext()
    with (root / ".build.lock").open("w") as lock, show:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another session may be building the same thing
        if not missing_binaries(bin_dir):
            return
        print(f"\n[e2e] building the Kubernetes binaries with {build_script()} (10-20 minutes the first time)")
        try:
            res = subprocess.run(["bash", str(build_script())], timeout=BUILD_TIMEOUT_S, check=False)
        except subprocess.TimeoutExpired as e:
            raise pytest.UsageError(f"{build_script()} did not finish within {BUILD_TIMEOUT_S}s") from e
        if res.returncode != 0 or missing_binaries(bin_dir):
            raise pytest.UsageError(f"{build_script()} failed (exit {res.returncode}); see its output above")


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Generator[None, Any, Any]:
    report = yield
    if report.failed and _ACTIVE and _uses_control_plane(item):
        report.sections.append(("control-plane logs (tail)", _ACTIVE[-1].logs_tail(25)))
        for node in _NODES:
            report.sections.append((f"kubelet node {node.name} (tail)", node.logs_tail(25)))
        for log in _DAEMON_LOGS:
            report.sections.append((f"daemon log {log.name} (tail)", _tail_text(log, 25)))
    return report


def _tail_text(path: Path, lines: int) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError as e:
        return f"(cannot read {path}: {e})"


def wait_until(check: Callable[[], Any], what: str, timeout: float = 60.0, interval: float = 0.3) -> Any:
    """:func:`~accel_rig.polling.poll_until`, taking an API error (an object not made yet) as "not yet"."""
    return poll_until(check, what, timeout, interval, tolerate=(ApiError,))


@pytest.fixture(scope="session")
def kube_binaries() -> Path:
    """The directory with the built binaries (built before the first test if missing)."""
    return kube_bin_dir()


@pytest.fixture(scope="session")
def control_plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    cp = ControlPlane(tmp_path_factory.mktemp("control-plane"), startup_timeout=180.0)
    _ACTIVE.append(cp)
    try:
        cp.start()
        yield cp
    finally:
        cp.stop()
        _ACTIVE.remove(cp)


@pytest.fixture(scope="session")
def kube_client(control_plane: ControlPlane) -> Iterator[Client]:
    client = Client(KubeConfig.from_file(control_plane.admin_kubeconfig), field_manager="accel-e2e")
    yield client
    client.close()


def unique_name(prefix: str) -> str:
    """A DNS-label name unique within this test session."""
    return f"{prefix}-{os.getpid() % 10000}-{next(_NAMES)}"


@pytest.fixture
def kube_cleanup(kube_client: Client) -> Iterator[list[GlobalResource | NamespacedResource]]:
    """Append created objects; they are deleted (in reverse order) after the test."""
    created: list[GlobalResource | NamespacedResource] = []
    yield created
    for obj in reversed(created):
        meta: ObjectMeta = getattr(obj, "metadata")  # noqa: B009 - the resource base classes do not declare it
        assert meta.name is not None
        with contextlib.suppress(ApiError):
            if isinstance(obj, NamespacedResource):
                kube_client.delete(type(obj), meta.name, namespace=meta.namespace)
            else:
                kube_client.delete(type(obj), meta.name)


@pytest.fixture
def namespace(kube_client: Client) -> Iterator[str]:
    """A new namespace with its ``default`` ServiceAccount in place; deleted after the test."""
    name = unique_name("e2e")
    kube_client.create(Namespace(metadata=ObjectMeta(name=name)))
    wait_until(
        lambda: kube_client.get(ServiceAccount, "default", namespace=name),
        f"the default ServiceAccount in {name} (made by kube-controller-manager)",
    )
    yield name
    with contextlib.suppress(ApiError):
        kube_client.delete(Namespace, name)


@pytest.fixture
def fake_node(control_plane: ControlPlane, kube_client: Client) -> Iterator[Callable[..., str]]:
    """Factory: ``fake_node(name=None, cpu=..., memory=..., pods=..., labels=...)`` -> node name.
    The Nodes are deleted after the test."""
    made: list[str] = []

    def make(name: str | None = None, **kwargs: Any) -> str:
        node_name = name or unique_name("fake-node")
        control_plane.create_fake_node(node_name, **kwargs)
        made.append(node_name)
        return node_name

    yield make
    for node_name in made:
        with contextlib.suppress(ApiError):
            kube_client.delete(Node, node_name)


@pytest.fixture
def wait() -> Callable[..., Any]:
    """``wait(check, what, timeout=60)``: see ``wait_until``."""
    return wait_until


@pytest.fixture
def new_name() -> Callable[[str], str]:
    """``new_name(prefix)``: see ``unique_name``."""
    return unique_name


# ---------------------------------------------------------------------------------------------------------------------
# Real kubelet nodes and our daemons


@dataclass
class RealNode:
    """A real kubelet node under test: the kubelet/fakecri pair and the fake host it stands on."""

    kubelet: KubeletNode
    host: FakeHost
    admin_kubeconfig: Path

    @property
    def name(self) -> str:
        return self.kubelet.name

    def env(self, **extra: str) -> dict[str, str]:
        """Environment for a daemon of this node (paths, NODE_NAME, the admin KUBECONFIG) plus ``extra``."""
        return {**self.kubelet.daemon_env(self.admin_kubeconfig), **extra}


@pytest.fixture
def kubelet_node(control_plane: ControlPlane, kube_client: Client) -> Iterator[Callable[..., RealNode]]:
    """Factory: ``kubelet_node("p5.48xlarge", lnc=None, efa=True, name=None)`` -> a Ready RealNode.

    This is the upstream kubelet (not the stand-in): it registers the Node, calls the device plugins and DRA
    drivers over their sockets, and asks the fake CRI runtime for the containers.
    """
    base = Path(tempfile.mkdtemp(prefix="kn-", dir="/dev/shm" if os.access("/dev/shm", os.W_OK) else None))
    disk_base = Path(tempfile.mkdtemp(prefix="kn-"))
    made: list[KubeletNode] = []

    def make(instance_type: str, *, lnc: int | None = None, efa: bool = True, name: str | None = None,
             runtime: str = "fakecri") -> RealNode:
        node_name = name or unique_name("kn")
        # containerd keeps image layers and an overlay on /dev under the node directory: on disk, not /dev/shm
        node_dir = (disk_base if runtime == CONTAINERD else base) / node_name
        node = KubeletNode(node_name, node_dir, server=control_plane.server, pki=control_plane.pki,
                           bin_dir=control_plane.bin_dir, instance_type=instance_type,
                           host_options={"efa": efa, "lnc": lnc}, runtime=runtime)
        host = build_host(node.layout.host_root, instance_type, efa=efa, lnc=lnc)
        made.append(node)
        _NODES.append(node)
        node.start()
        node.wait_ready(timeout=120)
        return RealNode(node, host, control_plane.admin_kubeconfig)

    yield make
    for node in made:
        # Pods go first, through the kubelet (it unprepares their claims); then the node.
        for pod in kube_client.list(Pod, namespace="*", fields={"spec.nodeName": node.name}):
            with contextlib.suppress(ApiError):
                kube_client.delete(Pod, pod.metadata.name, namespace=pod.metadata.namespace, grace_period=0)
        with contextlib.suppress(TimeoutError):
            wait_until(lambda n=node.name: not list(kube_client.list(Pod, namespace="*", fields={"spec.nodeName": n})),
                       f"the pods of {node.name} gone", timeout=30)
        node.stop()
        _NODES.remove(node)
        with contextlib.suppress(ApiError):
            kube_client.delete(Node, node.name)
    shutil.rmtree(base, ignore_errors=True)
    shutil.rmtree(disk_base, ignore_errors=True)


@dataclass
class Daemon:
    """One of our daemons running as a process (its console-script module run with this Python)."""

    argv: list[str]
    env: Mapping[str, str]
    log: Path
    proc: subprocess.Popen[bytes] | None = None

    def start(self) -> Daemon:
        full_env = {**{k: v for k, v in os.environ.items() if k != "KUBECONFIG"}, "PYTHONPATH": str(REPO_ROOT),
                    **self.env}
        with self.log.open("ab") as log:
            self.proc = subprocess.Popen([sys.executable, *self.argv], env=full_env, stdout=log,
                                         stderr=subprocess.STDOUT)
        return self

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 30.0) -> int:
        """Signal the process and wait for it; returns its exit code."""
        assert self.proc is not None
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
        return int(self.proc.returncode)

    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def tail(self, lines: int = 30) -> str:
        return _tail_text(self.log, lines)


REPO_ROOT = Path(__file__).resolve().parents[1]


def console_script(name: str) -> list[str]:
    """Arguments that run the console script ``name`` of this checkout with this Python (its entry point from
    the installed metadata, so a script added to pyproject.toml needs nothing here)."""
    (entry,) = [e for e in entry_points(group="console_scripts") if e.name == name]
    module, _, func = entry.value.partition(":")
    return ["-c", f"import sys; from {module} import {func}; sys.argv[0] = {name!r}; sys.exit({func}())"]


@pytest.fixture
def daemon(tmp_path: Path) -> Iterator[Callable[..., Daemon]]:
    """Factory: ``daemon("efa-device-plugin", "serve", "--metrics-port", "0", env={...})`` -> a started Daemon.
    Every daemon still running at the end of the test gets SIGTERM."""
    started: list[Daemon] = []

    def start(script: str, *args: str, env: Mapping[str, str]) -> Daemon:
        log = tmp_path / f"{script}-{len(started)}.log"
        d = Daemon([*console_script(script), *args], dict(env), log).start()
        started.append(d)
        _DAEMON_LOGS.append(log)
        return d

    yield start
    for d in started:
        if d.running():
            d.stop()
        _DAEMON_LOGS.remove(d.log)
