"""Pieces of the containerd rig that need no runtime: the CRI log format read back by `accel-cluster logs`, the
device nodes made from a fake host, the containerd config, and process records that survive a wall-clock step."""

from __future__ import annotations

import os
import subprocess
import sys
import tomllib
from pathlib import Path

import psutil
import pytest
from accel_rig.containerdnode import RuntimeBinaries, containerd_config, device_nodes, node_ip
from accel_rig.controlplane_processes import ProcessRecord, process_start_ticks, recorded_process
from accel_rig.podlogs import pod_log_lines

from accel_core.fakehost import build_host


def test_cri_log_lines_join_partial_lines_and_drop_the_prefix(tmp_path: Path) -> None:
    # The kubelet's CRI log format: "<RFC3339Nano time> <stdout|stderr> <P|F> <text>", P = partial line.
    d = tmp_path / "pods" / "ns1_web_0f0e" / "app"
    d.mkdir(parents=True)
    (d / "0.log").write_text("2026-12-03T10:00:00.1Z stdout F hello world\n"
                             "2026-12-03T10:00:00.2Z stdout P part one, \n"
                             "2026-12-03T10:00:00.3Z stdout F part two\n")
    (d / "1.log").write_text("2026-12-03T10:01:00.0Z stderr F after a restart\n")
    (d / "10.log").write_text("2026-12-03T10:02:00.0Z stdout F tenth restart\n")
    lines = pod_log_lines(tmp_path / "pods", "ns1", "web", "app")
    assert "".join(lines) == "hello world\npart one, part two\nafter a restart\ntenth restart\n"
    assert pod_log_lines(tmp_path / "pods", "ns1", "other", "app") == []
    assert pod_log_lines(tmp_path / "absent", "ns1", "web", "app") == []


def test_device_nodes_of_a_p5_host(tmp_path: Path) -> None:
    build_host(tmp_path / "h", "p5.48xlarge")
    nodes = dict(device_nodes(tmp_path / "h"))
    uverbs = {p: d for p, d in nodes.items() if p.startswith("/dev/infiniband/uverbs")}
    assert len(uverbs) == 32  # a p5.48xlarge has 32 EFA devices
    # Linux: the InfiniBand verbs character devices have major 231 and minors from 192 up.
    assert uverbs["/dev/infiniband/uverbs0"] == "231:192" and uverbs["/dev/infiniband/uverbs31"] == "231:223"
    assert "/dev/infiniband/rdma_cm" in nodes


def test_device_nodes_skip_a_malformed_dev_file(tmp_path: Path) -> None:
    host = build_host(tmp_path / "h", "trn2.48xlarge", efa=False)
    del host
    dev_file = tmp_path / "h" / "sys" / "class" / "neuron_device" / "neuron3" / "dev"
    dev_file.write_text("２４１:3\n")  # full-width digits are not a device number
    nodes = dict(device_nodes(tmp_path / "h"))
    assert "/dev/neuron3" not in nodes and "/dev/neuron2" in nodes


def test_containerd_config_is_version_3_with_cdi_and_the_oom_restriction(tmp_path: Path) -> None:
    conf = tomllib.loads(containerd_config(tmp_path, RuntimeBinaries(tmp_path / "rt", tmp_path / "img")))
    assert conf["version"] == 3
    runtime = conf["plugins"]["io.containerd.cri.v1.runtime"]
    assert "/var/run/cdi" in runtime["cdi_spec_dirs"]
    assert runtime["restrict_oom_score_adj"] is True
    assert runtime["containerd"]["runtimes"]["runc"]["options"]["BinaryName"].endswith("/usr/bin/runc")
    assert conf["plugins"]["io.containerd.cri.v1.images"]["pinned_images"]["sandbox"] == "example.local/pause:3.10"


def test_node_ips_are_private_and_stable() -> None:
    assert node_ip("n1") == node_ip("n1")
    a, b, c, d = (int(x) for x in node_ip("trn2-a").split("."))
    assert (a, b) == (10, 201) and 1 <= c <= 250 and 2 <= d <= 251


def test_a_record_survives_a_wall_clock_step(monkeypatch: pytest.MonkeyPatch) -> None:
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        rec = ProcessRecord.of("sleeper", proc.pid, "log")
        assert rec is not None and recorded_process(rec) is not None
        # The VM's clock steps 22 s: psutil's create_time (derived from the wall clock) moves, the process does not.
        real = psutil.Process.create_time
        monkeypatch.setattr(psutil.Process, "create_time", lambda self: real(self) + 22.0)
        assert recorded_process(rec) is not None
        # A record whose start time differs names another process that reused the PID.
        other = ProcessRecord("sleeper", proc.pid, rec.start_ticks + 1, "log", ())
        assert recorded_process(other) is None
    finally:
        proc.kill()
        proc.wait()
    assert process_start_ticks(proc.pid) is None


def test_start_ticks_read_past_a_command_name_with_parentheses(tmp_path: Path) -> None:
    tricky = tmp_path / "a) b (c"
    tricky.symlink_to(sys.executable)
    proc = subprocess.Popen([str(tricky), "-c", "import time; time.sleep(30)"])
    try:
        ticks = process_start_ticks(proc.pid)
        # /proc/PID/stat field 22 is the start time in clock ticks after boot: not after now, not before boot.
        uptime_ticks = float(Path("/proc/uptime").read_text().split()[0]) * os.sysconf("SC_CLK_TCK")
        assert ticks is not None and 0 < ticks <= uptime_ticks + 1
    finally:
        proc.kill()
        proc.wait()


def test_an_old_record_without_start_ticks_names_no_process() -> None:
    rec = ProcessRecord.from_json({"name": "etcd", "pid": os.getpid(), "create_time": 1.0, "log": "x", "ports": []})
    assert recorded_process(rec) is None


@pytest.mark.parametrize("namespace, pod", [("..", "x"), ("ns1", "*"), ("ns1", "../../etc"), ("NS", "web"),
                                            ("ns1", "web\n")])
def test_log_names_are_kubernetes_names_before_they_reach_a_glob(tmp_path: Path, namespace: str, pod: str) -> None:
    (tmp_path / "pods" / "ns1_web_0f0e" / "app").mkdir(parents=True)
    with pytest.raises(ValueError, match="not a Kubernetes name"):
        pod_log_lines(tmp_path / "pods", namespace, pod, "app")
