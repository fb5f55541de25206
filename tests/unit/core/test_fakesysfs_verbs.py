"""The ``fake-sysfs`` fault verbs (port, neuron-error, remove, restore, show): what each writes into a tree, bad
input as one line naming the device and the valid ones with exit status 2, and removals restored from another
process. The build form (``fake-sysfs --instance-type T DIR``) is tests/unit/core/test_fakehost.py's."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from test_fakehost import tree

from accel_core.awsfacts import catalog
from accel_core.fakehost import FakeHost, cli

TRN2 = "trn2.48xlarge"


@pytest.fixture(scope="module")
def trn2_efa() -> list[str]:
    """trn2.48xlarge's EFA names and PCI addresses, from the catalog (not from the fake host under test)."""
    spec = catalog.get(TRN2)
    assert spec.efa is not None
    return [d.ibdev for d in spec.efa.devices]


@pytest.fixture
def host(tmp_path: Path) -> Path:
    root = tmp_path / "h"
    assert cli.main(["--instance-type", TRN2, str(root)]) == 0
    return root


def fails(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    """Run a verb that must fail: exit 2 and one line on stderr (returned), nothing on stdout."""
    assert cli.main(argv) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.startswith("fake-sysfs: error: ") and err.count("\n") == 1, err
    return err


def read(root: Path, rel: str) -> str:
    return (root / rel).read_text()


def test_port_down_and_up_write_the_kernel_state_words(host: Path, trn2_efa: list[str],
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    ib = trn2_efa[0]
    port = f"sys/class/infiniband/{ib}/ports/1"
    assert cli.main(["port", str(host), ib, "down"]) == 0
    assert capsys.readouterr().out == f"{ib} port 1: ACTIVE -> DOWN\n"
    # the kernel's ib_port_state / phys_state words (include/rdma/ib_verbs.h): 1 DOWN, 4 ACTIVE; 3 Disabled, 5 LinkUp
    assert (read(host, f"{port}/state"), read(host, f"{port}/phys_state")) == ("1: DOWN\n", "3: Disabled\n")
    assert read(host, f"sys/class/infiniband/{trn2_efa[1]}/ports/1/state") == "4: ACTIVE\n", "only that device"
    assert cli.main(["port", str(host), ib, "up"]) == 0
    assert (read(host, f"{port}/state"), read(host, f"{port}/phys_state")) == ("4: ACTIVE\n", "5: LinkUp\n")
    assert cli.main(["port", str(host), ib, "init", "--port", "1"]) == 0
    assert read(host, f"{port}/state") == "2: INIT\n"


def test_neuron_error_adds_to_total_and_present_and_clear_zeroes(host: Path,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    hw = "sys/class/neuron_device/neuron3/stats/hardware"
    assert cli.main(["neuron-error", str(host), "neuron3"]) == 0
    assert cli.main(["neuron-error", str(host), "neuron3", "--count", "4"]) == 0
    assert cli.main(["neuron-error", str(host), "neuron3", "--counter", "sram_ecc_uncorrected", "--count", "2"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[1] == "neuron3: stats/hardware/mem_ecc_uncorrected/total = 5 (+4)"
    assert (read(host, f"{hw}/mem_ecc_uncorrected/total"), read(host, f"{hw}/mem_ecc_uncorrected/present")) == \
        ("5\n", "5\n")
    assert read(host, f"{hw}/sram_ecc_uncorrected/total") == "2\n"
    assert read(host, "sys/class/neuron_device/neuron2/stats/hardware/mem_ecc_uncorrected/total") == "0\n"
    assert cli.main(["neuron-error", str(host), "neuron3", "--clear"]) == 0
    for counter in ("mem_ecc_uncorrected", "mem_ecc_repairable_uncorrected", "sram_ecc_uncorrected"):
        assert read(host, f"{hw}/{counter}/total") == read(host, f"{hw}/{counter}/present") == "0\n"


def test_remove_and_restore_across_processes_is_exact(host: Path, trn2_efa: list[str]) -> None:
    """Each verb as its own process (the console script's module), as a user runs them: the restore finds what
    the earlier process removed, and the tree is byte for byte what it was."""
    cli.main(["neuron-error", str(host), "neuron5", "--count", "3"])
    before = tree(host)

    def verb(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "accel_core.fakehost.cli", *args], capture_output=True,
                              text=True, timeout=60, check=False)

    for device, gone in (("neuron5", ["dev/neuron5", "sys/class/neuron_device/neuron5"]),
                         (trn2_efa[2], [f"sys/class/infiniband/{trn2_efa[2]}"])):
        done = verb("remove", str(host), device)
        assert done.returncode == 0 and done.stdout.startswith(f"removed {device}"), done.stderr
        assert not any((host / rel).exists() for rel in gone)
        again = verb("remove", str(host), device)
        assert again.returncode == 2 and f"{device} is removed already" in again.stderr
        assert "Traceback" not in again.stderr
        done = verb("restore", str(host), device)
        assert done.returncode == 0 and done.stdout == f"restored {device} (device)\n", done.stderr
    assert tree(host) == before
    assert read(host, "sys/class/neuron_device/neuron5/stats/hardware/mem_ecc_uncorrected/total") == "3\n"


def test_remove_dev_node_only_then_restore(host: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["remove", str(host), "neuron0", "--dev-node"]) == 0
    assert not (host / "dev/neuron0").exists() and (host / "sys/class/neuron_device/neuron0/core_count").exists()
    assert FakeHost.attach(host).removed == ["dev:dev/neuron0"], "a new handle sees the removal"
    capsys.readouterr()
    err = fails(["remove", str(host), "neuron0"], capsys)
    assert "neuron0's /dev node is removed already" in err
    assert cli.main(["restore", str(host), "neuron0"]) == 0
    assert (host / "dev/neuron0").is_file() and not (host / ".fake-sysfs.removed.json").exists()


def test_show_lists_devices_and_their_state(host: Path, trn2_efa: list[str],
                                            capsys: pytest.CaptureFixture[str]) -> None:
    cli.main(["port", str(host), trn2_efa[1], "down"])
    cli.main(["neuron-error", str(host), "neuron7", "--count", "2"])
    cli.main(["remove", str(host), "neuron9"])
    capsys.readouterr()
    assert cli.main(["show", str(host)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == f"{TRN2} at {host}" and lines[1].split() == ["DEVICE", "KIND", "DEV", "NODE", "STATE"]
    rows = {line.split()[0]: line.split(None, 3)[1:] for line in lines[2:]}
    assert len(rows) == 32, "16 EFA + 16 Neuron"
    assert rows[trn2_efa[1]][0] == "EFA" and rows[trn2_efa[1]][2] == "port 1 DOWN"
    assert rows[trn2_efa[0]][2] == "port 1 ACTIVE"
    assert rows["neuron7"] == ["Neuron", "/dev/neuron7", "hw errors: mem_ecc_uncorrected=2"]
    assert rows["neuron9"][2] == "removed (device)" and rows["neuron0"][2] == "hw errors: none"


def test_bad_devices_are_one_line_naming_them_and_the_valid_ones(host: Path, trn2_efa: list[str],
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    err = fails(["port", str(host), "rdmap16s27", "down"], capsys)  # a p4d.24xlarge name, not a trn2 one
    assert "'rdmap16s27'" in err and TRN2 in err and all(ib in err for ib in trn2_efa) and "neuron15" in err
    err = fails(["port", str(host), "neuron3", "down"], capsys)
    assert "neuron3 is a Neuron device and has no ports" in err and trn2_efa[0] in err
    err = fails(["port", str(host), trn2_efa[0], "down", "--port", "2"], capsys)
    assert f"{trn2_efa[0]} has no port 2 (ports: 1)" in err
    err = fails(["neuron-error", str(host), trn2_efa[0]], capsys)
    assert f"{trn2_efa[0]} is not a Neuron device" in err and "neuron0" in err
    err = fails(["neuron-error", str(host), "neuron16"], capsys)
    assert "'neuron16'" in err and "neuron15" in err
    err = fails(["neuron-error", str(host), "neuron1", "--count", "0"], capsys)
    assert "at least 1" in err
    err = fails(["restore", str(host), "neuron1"], capsys)
    assert "neuron1 is not removed" in err
    cli.main(["remove", str(host), trn2_efa[3]])
    capsys.readouterr()
    err = fails(["port", str(host), trn2_efa[3], "up"], capsys)
    assert f"{trn2_efa[3]} is removed" in err and f"fake-sysfs restore {host} {trn2_efa[3]}" in err
    err = fails(["show", str(host / "nowhere")], capsys)
    assert f"{host / 'nowhere'} is not a fake-sysfs tree" in err and "--instance-type" in err
    assert "FAKE_HOST_DIR" in err, "a path that does not exist may be a containerd node's in-node HOST_ROOT"
    err = fails(["show", str(host / "sys")], capsys)
    assert "is not a fake-sysfs tree" in err and "FAKE_HOST_DIR" not in err


def test_a_tree_without_such_devices_says_so(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["-t", "c5.large", str(tmp_path / "c5")]) == 0
    capsys.readouterr()
    err = fails(["remove", str(tmp_path / "c5"), "neuron0"], capsys)
    assert "c5.large has no device 'neuron0'; it has no devices" in err
    assert cli.main(["-t", "p5.48xlarge", str(tmp_path / "p5")]) == 0
    capsys.readouterr()
    err = fails(["neuron-error", str(tmp_path / "p5"), "rdmap79s0"], capsys)
    assert "this p5.48xlarge has none" in err


@pytest.mark.parametrize("argv", [
    ["port", "/x", "rdmap79s0", "sideways"],
    ["port", "/x"],
    ["neuron-error", "/x", "neuron0", "--count", "1", "--clear"],
    ["neuron-error", "/x", "neuron0", "--counter", "hw_error"],
    ["remove"],
])
def test_usage_errors_exit_2(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        cli.main(argv)
    assert info.value.code == 2
    assert "usage: fake-sysfs" in capsys.readouterr().err


def test_help_names_the_verbs_and_the_build_form_still_works(tmp_path: Path,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        cli.main(["--help"])
    assert info.value.code == 0
    text = capsys.readouterr().out
    assert "--instance-type" in text and all(f"fake-sysfs {v} " in text for v in
                                             ("port", "neuron-error", "remove", "restore", "show"))
    for verb in ("port", "neuron-error", "remove", "restore", "show"):
        with pytest.raises(SystemExit) as info:
            cli.main([verb, "--help"])
        assert info.value.code == 0 and f"usage: fake-sysfs {verb}" in capsys.readouterr().out
    # the build form with a DIR whose name is a verb, through a path prefix
    port_dir = tmp_path / "port"
    assert cli.main(["-t", "inf2.xlarge", str(port_dir)]) == 0
    assert read(port_dir, "sys/class/dmi/id/product_name") == "inf2.xlarge\n"


def test_a_reader_that_stops_early_gets_no_traceback(host: Path) -> None:
    """``fake-sysfs show DIR | head -2``: the pipe is closed before the verb writes (here: before it starts)."""
    proc = subprocess.Popen([sys.executable, "-m", "accel_core.fakehost.cli", "show", str(host)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.close()
    err = proc.stderr.read().decode()
    assert proc.wait(60) == 0 and "Traceback" not in err, err


def test_removals_from_parallel_processes_are_all_recorded(host: Path) -> None:
    """Eight ``fake-sysfs remove`` processes at once (eight shells): every removal is in the record, so every
    restore works and the tree comes back whole."""
    before = tree(host)
    names = [f"neuron{i}" for i in range(8)]
    procs = [subprocess.Popen([sys.executable, "-m", "accel_core.fakehost.cli", "remove", str(host), name],
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE) for name in names]
    for proc in procs:
        assert proc.wait(60) == 0, proc.stderr.read() if proc.stderr else ""
    assert sorted(FakeHost.attach(host).removed) == sorted(f"neuron:{i}" for i in range(8))
    for name in names:
        assert cli.main(["restore", str(host), name]) == 0
    assert tree(host) == before
