"""Processes of the control plane and its nodes: start one with its output in a log, the ``cluster.json`` record
that finds them again (PID plus start time, so a reused PID is never mistaken for ours), stop them, read a log's
tail."""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import psutil

from accel_core.atomic import atomic_write_text
from accel_rig.controlplane_errors import ControlPlaneError

STATE_FILE = "cluster.json"
_PROXY_VARS = frozenset({"http_proxy", "https_proxy", "all_proxy", "no_proxy"})

@dataclass(frozen=True)
class ProcessRecord:
    """One running component as written to ``cluster.json``."""

    name: str
    pid: int
    #: The process's start time in clock ticks since boot (``/proc/PID/stat`` field 22): unlike psutil's
    #: ``create_time``, which is derived from the wall clock, it does not move when the clock is stepped.
    start_ticks: int
    log: str
    ports: tuple[int, ...]

    @classmethod
    def of(cls, name: str, pid: int, log: str, ports: tuple[int, ...] = ()) -> ProcessRecord | None:
        """A record of the running process ``pid``, or None when it is gone."""
        ticks = process_start_ticks(pid)
        return None if ticks is None else cls(name, pid, ticks, log, ports)

    @classmethod
    def from_json(cls, raw: Mapping[str, Any]) -> ProcessRecord:
        """Parse one record; a record of an older version (``create_time``, wall clock) names no live process."""
        return cls(name=str(raw["name"]), pid=int(raw["pid"]), start_ticks=int(raw.get("start_ticks", -1)),
                   log=str(raw["log"]), ports=tuple(int(x) for x in raw.get("ports", ())))


def process_start_ticks(pid: int) -> int | None:
    """Field 22 of ``/proc/PID/stat`` (start time in clock ticks after boot), or None when the process is gone.
    The command name (field 2) is in parentheses and may hold spaces or parentheses: split after the last ``)``."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = text[text.rfind(")") + 2:].split()
    try:
        return int(fields[19])  # fields[0] is field 3 (state)
    except (IndexError, ValueError):
        return None


@dataclass(frozen=True)
class ClusterRecord:
    """``cluster.json``: what ``accel-cluster`` needs to find a running control plane again."""

    server: str
    admin_kubeconfig: str
    ca_cert: str
    processes: tuple[ProcessRecord, ...] = ()
    ports: Mapping[str, tuple[int, ...]] = field(default_factory=dict)

    def save(self, state_dir: Path) -> None:
        atomic_write_text(state_dir / STATE_FILE, json.dumps(asdict(self), indent=2) + "\n", mode=0o644, durable=False)

    @classmethod
    def load(cls, state_dir: Path) -> ClusterRecord | None:
        """The record in ``state_dir``, or None when there is none; a damaged file is an error naming it."""
        path = state_dir / STATE_FILE
        try:
            raw = json.loads(path.read_text())
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as e:
            raise ControlPlaneError(f"cannot read {path}: {e}") from e
        try:
            procs = tuple(ProcessRecord.from_json(p) for p in raw.get("processes", []))
            ports = {str(k): tuple(int(x) for x in v) for k, v in raw.get("ports", {}).items()}
            return cls(
                server=str(raw["server"]),
                admin_kubeconfig=str(raw["admin_kubeconfig"]),
                ca_cert=str(raw["ca_cert"]),
                processes=procs,
                ports=ports,
            )
        except (KeyError, TypeError, ValueError) as e:
            raise ControlPlaneError(f"{path} is damaged ({e!r}); remove it and start again") from e


def recorded_process(rec: ProcessRecord) -> psutil.Process | None:
    """The live process a record names, or None if it is gone (or its PID now belongs to another process: its
    start time in clock ticks differs, which a step of the wall clock cannot cause)."""
    try:
        proc = psutil.Process(rec.pid)
        if process_start_ticks(rec.pid) != rec.start_ticks or proc.status() == psutil.STATUS_ZOMBIE:
            return None
        return proc
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return None


def terminate_processes(procs: Sequence[psutil.Process], timeout: float) -> None:
    """SIGTERM each process, wait up to ``timeout`` seconds, then SIGKILL and reap what is left."""
    for p in procs:
        with contextlib.suppress(psutil.NoSuchProcess):
            p.terminate()
    _, alive = psutil.wait_procs(list(procs), timeout=timeout)
    for p in alive:
        with contextlib.suppress(psutil.NoSuchProcess):
            p.kill()
    # a killed process still in an fsync (etcd on a busy disk) exits only when the write returns
    _, stuck = psutil.wait_procs(alive, timeout=30)
    for p in stuck:
        print(f"process {p.pid} still running 30 s after SIGKILL", file=sys.stderr)


def _die_with_parent() -> None:
    """Runs in the child before exec: ask the kernel to SIGKILL it when the parent dies
    (no one is left to wait for a graceful stop, and the API server can hang once etcd is gone)."""
    if sys.platform.startswith("linux"):
        pr_set_pdeathsig = 1
        ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, int(signal.SIGKILL))


def spawn_logged(cmd: Sequence[str], log_path: Path, *, cwd: Path, detach: bool) -> tuple[subprocess.Popen[bytes], int]:
    """Start ``cmd`` in its own session with stdout/stderr appended to ``log_path`` (after a header line); returns
    the process and the log offset where its output starts. Without ``detach`` the child dies with its parent."""
    # No HTTP proxy of the environment: the rig's traffic stays on loopback and in its own namespaces.
    env = {k: v for k, v in os.environ.items() if k != "KUBECONFIG" and k.lower() not in _PROXY_VARS}
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with log_path.open("ab") as log:
        offset = log.tell()
        log.write(f"--- {time.strftime('%Y-%m-%dT%H:%M:%S')} {' '.join(cmd)}\n".encode())
        log.flush()
        proc = subprocess.Popen(
            list(cmd),
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=cwd,
            env=env,
            start_new_session=True,
            preexec_fn=None if detach else _die_with_parent,
        )
    return proc, offset


def tail_file(path: Path, lines: int) -> str:
    """The last ``lines`` lines of a (log) file, or a note that it cannot be read."""
    try:
        with path.open("rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - 256 * 1024))
            data = f.read()
    except OSError as e:
        return f"(cannot read {path}: {e})"
    return "\n".join(data.decode("utf-8", "replace").splitlines()[-lines:])

