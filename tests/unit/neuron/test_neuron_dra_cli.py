"""``neuron-dra-driver slices``: the ResourceSlices serve would publish, printed without an API server."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from hostcache import copy_host

from neuron_dra.dra.cli import CLI, main


def test_slices_prints_the_pool_as_yaml_and_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    host = copy_host(tmp_path / "host", "trn1.32xlarge")
    host.remove_dev_node("/dev/neuron2")
    assert main(["slices", "--host-root", str(tmp_path / "host"), "--node-name", "n1", "--output", "yaml"]) == 0
    [obj] = yaml.safe_load(capsys.readouterr().out)
    assert obj["apiVersion"] == "resource.k8s.io/v1" and obj["kind"] == "ResourceSlice"
    assert obj["metadata"] == {"generateName": "n1-neuron.aws.com-"}
    assert obj["spec"]["driver"] == "neuron.aws.com" and obj["spec"]["nodeName"] == "n1"
    assert obj["spec"]["pool"] == {"name": "n1", "generation": 1, "resourceSliceCount": 1}
    devices = {d["name"]: d for d in obj["spec"]["devices"]}
    assert len(devices) == 16
    assert devices["neuron-device-2"]["taints"] == [
        {"key": "neuron.aws.com/unhealthy", "value": "DevNodeMissing", "effect": "NoSchedule"}]
    assert "capacity" not in devices["neuron-device-0"]  # AWS's attribute reference names none
    assert devices["neuron-device-0"]["attributes"]["deviceId"] == {"int": 0}

    assert main(["slices", "--host-root", str(tmp_path / "host"), "--node-name", "n1", "--node-uid", "uid-7"]) == 0
    [as_json] = json.loads(capsys.readouterr().out)
    assert as_json["metadata"]["ownerReferences"] == [
        {"apiVersion": "v1", "kind": "Node", "name": "n1", "uid": "uid-7", "controller": True}]
    assert as_json["spec"] == obj["spec"]


def test_no_hardware_prints_no_slices(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    copy_host(tmp_path / "host", "c5.large")
    assert main(["slices", "--host-root", str(tmp_path / "host"), "--node-name", "n1"]) == 0
    assert json.loads(capsys.readouterr().out) == []


def test_node_name_is_required(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.delenv("NODE_NAME", raising=False)
    assert main(["slices", "--host-root", "/nonexistent"]) == 2
    assert "--node-name" in capsys.readouterr().err


def test_cleanup_interval_flag(capsys: pytest.CaptureFixture[str]) -> None:
    assert CLI.parser().parse_args(["serve"]).cleanup_interval == 600
    assert CLI.parser().parse_args(["serve", "--cleanup-interval", "0"]).cleanup_interval == 0
    with pytest.raises(SystemExit):
        CLI.parser().parse_args(["serve", "--cleanup-interval", "-5"])
    assert "must be 0 (off) or more seconds" in capsys.readouterr().err


def test_rescan_and_health_poll_flags(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.delenv("RESCAN_INTERVAL", raising=False)
    monkeypatch.delenv("HEALTH_POLL_INTERVAL", raising=False)
    args = CLI.parser().parse_args(["serve"])
    assert (args.rescan_interval, args.health_poll_interval) == (60, 0.75), "the device plugins' pace"
    monkeypatch.setenv("RESCAN_INTERVAL", "30")
    monkeypatch.setenv("HEALTH_POLL_INTERVAL", "0.5")
    args = CLI.parser().parse_args(["serve", "--health-poll-interval", "2"])
    assert (args.rescan_interval, args.health_poll_interval) == (30, 2), "a flag wins over its variable"
    with pytest.raises(SystemExit):
        CLI.parser().parse_args(["serve", "--health-poll-interval", "0"])
    assert "must be more than 0 seconds" in capsys.readouterr().err


def test_unhealthy_taint_effect_and_device_status_settings(monkeypatch: pytest.MonkeyPatch,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.delenv("UNHEALTHY_TAINT_EFFECT", raising=False)
    monkeypatch.delenv("DEVICE_STATUS", raising=False)
    args = CLI.parser().parse_args(["serve"])
    assert (args.unhealthy_taint_effect, args.device_status) == ("NoSchedule", "on")
    monkeypatch.setenv("UNHEALTHY_TAINT_EFFECT", "NoExecute")
    monkeypatch.setenv("DEVICE_STATUS", "off")
    args = CLI.parser().parse_args(["serve"])
    assert (args.unhealthy_taint_effect, args.device_status) == ("NoExecute", "off")
    monkeypatch.setenv("UNHEALTHY_TAINT_EFFECT", "Evict")
    with pytest.raises(SystemExit):
        CLI.parser().parse_args(["serve"])
    err = capsys.readouterr().err
    assert "UNHEALTHY_TAINT_EFFECT" in err and "NoSchedule, NoExecute" in err and len(err.strip().splitlines()) == 1
