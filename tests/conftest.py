"""Shared fixtures."""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import hostcache
import pytest
from hypothesis import settings

#: The real-Kubernetes fixtures (control plane, kubelet nodes, daemons) for tests/e2e and tests/rig/e2e.
pytest_plugins = ["kube_fixtures"]

# Hypothesis' per-example deadline is a timed assertion: on a shared 2-core machine under load it fails examples that
# are correct but slow (observed: 407 ms against the default 200 ms at load 13). Timing lives in bench/, so no test
# here has a deadline; the examples themselves still run in full.
settings.register_profile("aws-accel-agents", deadline=None)
settings.load_profile("aws-accel-agents")

# Fake hosts are thousands of small files (a trn2.48xlarge tree is ~12k): on tmpfs the suite's file work is about
# ten times faster than on the VM disk. Used when /dev/shm is there and the caller did not pick --basetemp.
RAM_DIR = Path("/dev/shm")
_RAM_BASETEMP = pytest.StashKey[str]()


def _ram_base() -> Path | None:
    return RAM_DIR if RAM_DIR.is_dir() and os.access(RAM_DIR, os.W_OK) else None


_PREFIX = f"aws-accel-agents-pytest-{os.getuid()}-"


def _clear_dead_runs(base: Path) -> None:
    """Remove the temp trees of earlier runs whose pytest process is gone (a red run keeps its files until then)."""
    for entry in base.glob(_PREFIX + "*"):
        pid = entry.name.removeprefix(_PREFIX)
        if pid.isascii() and pid.isdigit() and not Path(f"/proc/{pid}").exists():
            hostcache.unmount_below(entry)  # overlay copies a killed run left mounted
            shutil.rmtree(entry, ignore_errors=True)


def pytest_configure(config: pytest.Config) -> None:
    # The charts' local dependencies (charts/<chart>/charts/accel-dra-lib) are copies: fresh for every run.
    subprocess.run([str(Path(__file__).resolve().parents[1] / "scripts" / "chart-deps.sh")], check=True, timeout=60)
    base = _ram_base()
    if base is not None and not config.option.basetemp:
        # One tree per pytest process: concurrent runs (two checkouts, a benchmark) never share or delete each
        # other's temp files.
        _clear_dead_runs(base)
        config.option.basetemp = str(base / f"{_PREFIX}{os.getpid()}")
        config.stash[_RAM_BASETEMP] = config.option.basetemp


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Give the RAM back after a green run; a red run keeps its files for a look (the next run clears them)."""
    ram = session.config.stash.get(_RAM_BASETEMP, None)
    if ram is not None and exitstatus == 0:
        shutil.rmtree(ram, ignore_errors=True)


@pytest.fixture
def short_tmp() -> Iterator[Path]:
    """A temp dir with a short path: unix socket paths must stay under 108 bytes."""
    path = Path(tempfile.mkdtemp(prefix="aa-", dir=str(_ram_base() or "/tmp")))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(scope="session", autouse=True)
def _pristine_hosts(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """Where tests/hostcache.py keeps the fake hosts it generates once per session; at the end, every shared tree
    must still be as built (this also covers trees a module-scoped fixture kept between tests)."""
    base = tmp_path_factory.getbasetemp()
    if base.name.startswith("popen-gw"):  # an xdist worker: its workers share the run's trees
        hostcache.ROOT = base.parent / "pristine-hosts"
        hostcache.ROOT.mkdir(exist_ok=True)
    else:
        hostcache.ROOT = tmp_path_factory.mktemp("pristine-hosts")
    yield
    hostcache.unmount_all()  # copies kept by fixtures wider than a test
    changed = {str(root): hostcache.changes(root)[:5] for root in hostcache.all_shared() if hostcache.changes(root)}
    hostcache.ROOT = None
    assert not changed, f"shared fake hosts were changed during the session: {changed}"


@pytest.fixture(autouse=True)
def _shared_hosts_unchanged() -> Iterator[None]:
    """A test given a shared fake host (hostcache.shared_host) must leave it as built."""
    hostcache.take_shared_used()
    yield
    for root in hostcache.take_shared_used():
        changed = hostcache.changes(root)
        assert not changed, (f"the shared fake host {root} changed during this test (or one on another xdist "
                             f"worker): {changed[:5]}; a test that changes a host needs copy_host")


_CALL_PASSED = pytest.StashKey[bool]()
#: The per-test temp-dir fixtures whose contents are removed when the test ends anyway.
_PER_TEST_DIRS = ("tmp_path", "short_tmp")


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[pytest.TestReport]:
    report: pytest.TestReport = yield
    if report.when == "call":
        item.stash[_CALL_PASSED] = report.passed
    return report


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_teardown(item: pytest.Item) -> None:
    """A passed test's fake-host copies inside its own temp dirs go with one ``rm -rf`` (half the CPU of the
    fixtures' shutil.rmtree on a 17k-entry tree) just before those fixtures remove the rest; a failed test keeps
    them for a look."""
    copies = hostcache.take_copies()
    if not copies:
        return
    funcargs = getattr(item, "funcargs", {})
    dirs = [Path(funcargs[name]) for name in _PER_TEST_DIRS if isinstance(funcargs.get(name), Path)]
    mine = [c for c in copies if any(c.is_relative_to(d) for d in dirs)]
    hostcache.unmount(mine)  # overlay copies (a failed test's changes stay in its upper layer for a look)
    if mine and item.stash.get(_CALL_PASSED, False):
        layers = [c.parent / f".{c.name}.overlay" for c in mine]
        subprocess.run(["rm", "-rf", "--", *map(str, mine), *map(str, layers)], check=False)


@pytest.fixture(autouse=True)
def _restore_root_logging() -> Iterator[None]:
    """A daemon's main run in-process points the root logger at that test's captured stderr (``setup_logging``);
    put the handlers back, so a later test's log line never goes to a closed stream ("--- Logging error ---")."""
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    yield
    root.handlers[:] = handlers
    root.setLevel(level)
