"""Fake-sysfs host: catalog numbers, generated layout, mutations and the CLI."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from hostcache import shared_host

import efa_plugin
import neuron_dra.facts
from accel_core.awsfacts import catalog
from accel_core.awsfacts.catalog import CatalogError, UnknownInstanceType
from accel_core.fakehost import FakeHost, FakeHostError, build_host, cli
from efa_plugin.facts import efa_count, gpu_count, neuron_efa_map
from neuron_dra.facts.catalog import cores_per_device, neuron_count, supports_lnc

EXPECTED_EFA = {
    "p4d.24xlarge": 4,
    "p5.48xlarge": 32,
    "p5en.48xlarge": 16,
    "p6-b200.48xlarge": 8,
    "trn1.2xlarge": 0,
    "trn1.32xlarge": 8,
    "trn1n.32xlarge": 16,
    "trn2.3xlarge": 1,
    "trn2.48xlarge": 16,
    "trn2u.48xlarge": 16,
    "inf1.xlarge": 0,
    "inf2.xlarge": 0,
    "inf2.24xlarge": 0,
    "inf2.48xlarge": 0,
    "c5.large": 0,
}
EXPECTED_NEURON = {
    "inf1.xlarge": (1, 4),
    "inf2.xlarge": (1, 2),
    "inf2.24xlarge": (6, 2),
    "inf2.48xlarge": (12, 2),
    "trn1.2xlarge": (1, 2),
    "trn1.32xlarge": (16, 2),
    "trn1n.32xlarge": (16, 2),
    "trn2.3xlarge": (1, 8),
    "trn2.48xlarge": (16, 8),
    "trn2u.48xlarge": (16, 8),
}
EXPECTED_ARCH = {  # device arch_type, core arch_type, instance_type, device_name (driver dhal tables)
    "inf1.xlarge": ("NDv1", "NCv1", "Inf1", "Inferentia"),
    "inf2.48xlarge": ("NDv3", "NCv2", "Inf2", "Inferentia2"),
    "trn1.32xlarge": ("NDv2", "NCv2", "Trn1", "Trainium1"),
    "trn2.48xlarge": ("NDv3", "NCv3", "Trn2", "Trainium2"),
}
# neuron.md section 3: EFA bus per Neuron device on trn2 (all at bb:00.0)
TRN2_EFA_BUS = ["c9", "b4", "b3", "ca", "6c", "57", "56", "6d", "98", "83", "82", "99", "f5", "e0", "df", "f6"]


def read(root: Path, rel: str) -> str:
    return (root / rel).read_text()


def tree(root: Path) -> dict[str, tuple[str, str]]:
    """Every node under root: ('d', ''), ('f', content) or ('l', link target)."""
    out: dict[str, tuple[str, str]] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            p = Path(dirpath) / name
            rel = str(p.relative_to(root))
            if p.is_symlink():
                out[rel] = ("l", os.readlink(p))
            elif p.is_dir():
                out[rel] = ("d", "")
            else:
                out[rel] = ("f", p.read_text())
    return out


def torus_neighbours(i: int) -> set[int]:
    r, c = divmod(i, 4)
    return {((r - 1) % 4) * 4 + c, ((r + 1) % 4) * 4 + c, r * 4 + (c - 1) % 4, r * 4 + (c + 1) % 4}


# ------------------------------------------------------------------------------------------------ catalog


#: this project's catalog files (the catalog's own, EFA's, Neuron's); catalog.names() adds those of other installed
#: accelerators (tests/sample_accelerator)
CATALOG_FILES = tuple(Path(m.__file__ or "").with_name("instances.yaml")
                      for m in (catalog, efa_plugin, neuron_dra.facts))
PACKAGED = set(catalog.load(*CATALOG_FILES))


def test_catalog_lists_every_expected_type() -> None:
    assert set(EXPECTED_EFA) == PACKAGED and set(catalog.names()) >= PACKAGED


@pytest.mark.parametrize("name", sorted(EXPECTED_EFA))
def test_catalog_counts(name: str) -> None:
    t = catalog.get(name)
    assert efa_count(t) == EXPECTED_EFA[name]
    assert (neuron_count(t), cores_per_device(t)) == EXPECTED_NEURON.get(name, (0, 0))
    assert gpu_count(t) == (8 if name.startswith("p") else 0)


def test_unknown_type_error_lists_known_types() -> None:
    with pytest.raises(KeyError) as info:
        catalog.get("x9.huge")
    assert isinstance(info.value, UnknownInstanceType)
    assert "x9.huge" in str(info.value) and "trn2.48xlarge" in str(info.value)


def test_malformed_catalog_names_type_and_field(tmp_path: Path) -> None:
    bad = tmp_path / "cat.yaml"
    bad.write_text(
        "types:\n  z1.big:\n    family: z1\n    neuron:\n      pci_device_id: '0x7364'\n"
        "      architecture: {arch_type: NDv3, core_arch_type: NCv3, instance_type: Trn2, device_name: T}\n"
        "      cores_per_device: 8\n      memory_bytes: 1\n      topology: ring\n"
        "      devices:\n        - {index: 0, bdf: 'nonsense', root: pci0000:00, numa: 0, connected: []}\n"
    )
    with pytest.raises(CatalogError, match=r"z1\.big.*bdf"):
        catalog.load(bad)


def test_lnc_default_only_on_trn2() -> None:
    for name in catalog.names():
        t = catalog.get(name)
        assert supports_lnc(t) == (t.family == "trn2" or t.family == "trn2u")
        if supports_lnc(t):
            assert t.neuron is not None and t.neuron.lnc_default == 2


def test_efa_mapping_tables_match_reference() -> None:
    trn2 = neuron_efa_map(catalog.get("trn2.48xlarge"))
    assert trn2 == {i: f"0000:{bus}:00.0" for i, bus in enumerate(TRN2_EFA_BUS)}
    trn1 = neuron_efa_map(catalog.get("trn1.32xlarge"))
    assert trn1[0] == trn1[1] == "0000:10:1a.0" and trn1[14] == trn1[15] == "0000:a0:19.0"
    assert len(set(trn1.values())) == 8
    assert neuron_efa_map(catalog.get("trn1n.32xlarge"))[5] == "0000:20:18.0"
    assert neuron_efa_map(catalog.get("trn2.3xlarge")) == {}  # not an EFA-mapping-library instance


# ------------------------------------------------------------------------------------------------ layout


@pytest.mark.parametrize("name", sorted(EXPECTED_EFA))
def test_every_type_builds_with_real_layout(tmp_path: Path, name: str) -> None:
    host = build_host(tmp_path, name)
    spec = catalog.get(name)
    assert read(tmp_path, "sys/class/dmi/id/product_name") == f"{name}\n"
    assert len(host.efa_ibdevs) == EXPECTED_EFA[name]
    ib_class = tmp_path / "sys/class/infiniband"
    ib_names = sorted(p.name for p in ib_class.iterdir()) if ib_class.exists() else []
    assert ib_names == sorted(host.rdma_ibdevs)
    uverbs = sorted((tmp_path / "dev/infiniband").glob("uverbs*")) if ib_names else []
    assert len(uverbs) == len(ib_names)

    efa_by_ib = {d.ibdev: d for d in spec.efa.devices} if spec.efa else {}
    for ib in host.efa_ibdevs:
        dev = efa_by_ib[ib]
        ibdir = (ib_class / ib).resolve()
        pci = (ibdir / "device").resolve()
        assert ibdir.parent.parent == pci and pci.name == dev.pci.bdf
        assert pci.relative_to((tmp_path / "sys/devices").resolve()).parts[0] == dev.pci.root
        assert (tmp_path / "sys/bus/pci/devices" / dev.pci.bdf).resolve() == pci
        assert spec.efa is not None
        assert read(pci, "vendor") == "0x1d0f\n" and read(pci, "device") == f"{spec.efa.pci_device_id}\n"
        assert (pci / "driver").resolve().name == "efa"
        assert read(pci, "numa_node") == f"{dev.pci.numa_node}\n"
        assert read(ibdir, "ports/1/state") == "4: ACTIVE\n"
        assert read(ibdir, "ports/1/phys_state") == "5: LinkUp\n"
        assert read(ibdir, "hw_counters/submitted_cmds") == "0\n"
        assert read(ibdir, "ports/1/hw_counters/retrans_timeout_events") == "0\n"
        uv = host.uverbs_of(ib)
        verbs = tmp_path / "sys/class/infiniband_verbs" / uv
        assert read(verbs, "ibdev") == f"{ib}\n"
        assert read(verbs, "dev") == f"231:{192 + int(uv[6:])}\n"
        assert (verbs / "device").resolve() == pci
        assert (tmp_path / "dev/infiniband" / uv).is_file()

    neuron_dirs = sorted((tmp_path / "sys/class/neuron_device").glob("neuron[0-9]*"))
    count, cores = EXPECTED_NEURON.get(name, (0, 0))
    assert len(neuron_dirs) == count == host.neuron_count
    if count:
        assert spec.neuron is not None
        assert read(tmp_path, "sys/module/neuron/version").strip() == spec.neuron.driver_version
    for i in range(count):
        assert spec.neuron is not None
        d = (tmp_path / f"sys/class/neuron_device/neuron{i}").resolve()
        assert d == (tmp_path / f"sys/devices/virtual/neuron_device/neuron{i}").resolve()
        assert read(d, "core_count") == str(cores)  # no trailing newline, like the driver
        assert len(list(d.glob("neuron_core*"))) == cores
        assert (tmp_path / f"dev/neuron{i}").is_file()
        fn = spec.neuron.devices[i].pci
        pdir = (tmp_path / "sys/bus/pci/devices" / fn.bdf).resolve()
        assert read(pdir, "numa_node") == f"{fn.numa_node}\n"
        assert (pdir / "driver").resolve().name == "neuron-driver"


@pytest.mark.parametrize("name", sorted(EXPECTED_ARCH))
def test_neuron_architecture_and_stats(name: str) -> None:
    root = shared_host(name).root  # the builder's tree, built once per session
    d = root / "sys/class/neuron_device/neuron0"
    nd, nc, inst, dev_name = EXPECTED_ARCH[name]
    assert read(d, "info/architecture/arch_type") == f"{nd}\n"
    assert read(d, "info/architecture/instance_type") == f"{inst}\n"
    assert read(d, "info/architecture/device_name") == f"{dev_name}\n"
    assert read(d, "neuron_core0/info/architecture/arch_type") == f"{nc}\n"
    for rel in (
        "neuron_core0/stats/status/hw_error/total",
        "neuron_core0/stats/status/success/present",
        "neuron_core0/stats/memory_usage/device_mem/tensors/peak",
        "stats/hardware/mem_ecc_uncorrected/total",
        "stats/hardware/sram_ecc_uncorrected/present",
        "neuron_core0/stats/other_info/nc_time_in_use",
    ):
        assert read(d, rel) == "0\n", rel


@pytest.mark.parametrize("name", sorted(EXPECTED_NEURON))
def test_connected_devices_symmetric_and_match_topology(name: str) -> None:
    root = shared_host(name).root  # the builder's tree, built once per session
    n = EXPECTED_NEURON[name][0]
    neigh: dict[int, list[int]] = {}
    for i in range(n):
        text = read(root, f"sys/class/neuron_device/neuron{i}/connected_devices")
        assert text.endswith("\n")
        neigh[i] = [int(x) for x in text.strip().split(", ")] if text.strip() else []
    for i, js in neigh.items():
        assert all(i in neigh[j] for j in js), f"{name}: neuron{i} -> {js} not symmetric"
    neuron = catalog.get(name).neuron
    assert neuron is not None
    topology = neuron.topology
    for i in range(n):
        if topology == "torus4x4":
            assert set(neigh[i]) == torus_neighbours(i)
        elif topology == "ring":
            assert set(neigh[i]) == {(i - 1) % n, (i + 1) % n}
        elif topology == "chain":
            assert set(neigh[i]) == {j for j in (i - 1, i + 1) if 0 <= j < n}
        else:
            assert topology == "single" and neigh[i] == []


def test_connected_devices_driver_order() -> None:
    a, b = shared_host("trn1.32xlarge").root, shared_host("trn2.48xlarge").root  # built once per session
    assert read(a, "sys/class/neuron_device/neuron0/connected_devices") == "12, 3, 4, 1\n"
    assert read(a, "sys/class/neuron_device/neuron5/connected_devices") == "1, 4, 9, 6\n"
    assert read(b, "sys/class/neuron_device/neuron0/connected_devices") == "12, 1, 3, 4\n"
    assert read(b, "sys/class/neuron_device/neuron5/connected_devices") == "4, 9, 1, 6\n"


def test_p6_b200_mlx5_devices_come_first(tmp_path: Path) -> None:
    host = build_host(tmp_path, "p6-b200.48xlarge")
    assert host.rdma_ibdevs[:2] == ["ibp115s0f0", "ibp116s0f0"]
    assert len(host.efa_ibdevs) == 8 and all(ib.startswith("rdmap") for ib in host.efa_ibdevs)
    for uv, ib in (("uverbs0", "ibp115s0f0"), ("uverbs1", "ibp116s0f0")):
        verbs = tmp_path / "sys/class/infiniband_verbs" / uv
        assert read(verbs, "ibdev") == f"{ib}\n"
        pci = (verbs / "device").resolve()
        assert read(pci, "vendor") == "0x15b3\n"
        assert (pci / "driver").resolve().name == "mlx5_core"
    assert host.uverbs_of("rdmap79s0") == "uverbs2"


def test_no_efa_keeps_only_non_efa_rdma(tmp_path: Path) -> None:
    p6 = build_host(tmp_path / "p6", "p6-b200.48xlarge", efa=False)
    assert p6.efa_ibdevs == []
    assert sorted(p.name for p in (tmp_path / "p6/sys/class/infiniband").iterdir()) == ["ibp115s0f0", "ibp116s0f0"]
    assert not (tmp_path / "p6/sys/bus/pci/drivers/efa").exists()
    build_host(tmp_path / "p5", "p5.48xlarge", efa=False)
    assert not (tmp_path / "p5/sys/class/infiniband").exists()
    assert not (tmp_path / "p5/dev/infiniband").exists()
    trn = build_host(tmp_path / "trn", "trn2.48xlarge", efa=False)
    assert trn.neuron_count == 16 and not (tmp_path / "trn/sys/class/infiniband").exists()


def test_lnc_file_and_errors(tmp_path: Path) -> None:
    build_host(tmp_path / "a", "trn2.48xlarge", lnc=1)
    assert read(tmp_path, "a/opt/aws/neuron/logical_nc_config") == "NEURON_LOGICAL_NC_CONFIG=1\n"
    build_host(tmp_path / "b", "trn2.48xlarge")
    assert not (tmp_path / "b/opt").exists()
    with pytest.raises(FakeHostError, match="trn1.32xlarge"):
        build_host(tmp_path / "c", "trn1.32xlarge", lnc=2)
    with pytest.raises(FakeHostError, match="1 or 2"):
        build_host(tmp_path / "d", "trn2.3xlarge", lnc=4)


def test_boot_id_fixed_per_type_and_build_refuses_existing_tree(tmp_path: Path) -> None:
    build_host(tmp_path / "a", "c5.large")
    build_host(tmp_path / "b", "c5.large")
    build_host(tmp_path / "c", "p4d.24xlarge")
    a = read(tmp_path, "a/proc/sys/kernel/random/boot_id")
    assert a == read(tmp_path, "b/proc/sys/kernel/random/boot_id")
    assert a != read(tmp_path, "c/proc/sys/kernel/random/boot_id")
    with pytest.raises(FakeHostError, match="already holds"):
        build_host(tmp_path / "a", "c5.large")


# ------------------------------------------------------------------------------------------------ mutations


@pytest.fixture
def p5(tmp_path: Path) -> FakeHost:
    return build_host(tmp_path, "p5.48xlarge")


@pytest.fixture
def trn2(tmp_path: Path) -> FakeHost:
    return build_host(tmp_path, "trn2.3xlarge")


def test_remove_and_restore_efa_is_exact(p5: FakeHost) -> None:
    ib = "rdmap80s0"
    p5.set_efa_counter(ib, "tx_bytes", 12345, port=1)
    p5.set_port_state(ib, "DOWN")
    before = tree(p5.root)
    uv = p5.uverbs_of(ib)
    p5.remove_efa(ib)
    assert not (p5.root / "sys/class/infiniband" / ib).exists()
    assert not (p5.root / "sys/class/infiniband_verbs" / uv).exists()
    assert not (p5.root / "dev/infiniband" / uv).exists()
    assert not (p5.root / "sys/bus/pci/devices/0000:50:00.0").exists()
    assert not any("0000:50:00.0" in rel for rel in tree(p5.root))
    assert p5.removed == [f"efa:{ib}"]
    with pytest.raises(FakeHostError, match="already removed"):
        p5.remove_efa(ib)
    p5.restore_efa(ib)
    assert tree(p5.root) == before
    with pytest.raises(FakeHostError, match="not removed"):
        p5.restore_efa(ib)


def test_remove_and_restore_neuron_is_exact(trn2: FakeHost) -> None:
    trn2.set_neuron_counter(0, "neuron_core3/stats/status/hw_error/total", 7)
    before = tree(trn2.root)
    trn2.remove_neuron(0)
    assert not (trn2.root / "sys/class/neuron_device/neuron0").exists()
    assert not (trn2.root / "sys/devices/virtual/neuron_device/neuron0").exists()
    assert not (trn2.root / "dev/neuron0").exists()
    trn2.restore_neuron(0)
    assert tree(trn2.root) == before
    assert read(trn2.root, "sys/class/neuron_device/neuron0/neuron_core3/stats/status/hw_error/total") == "7\n"


def test_port_state_and_counters(p5: FakeHost) -> None:
    ibdir = p5.ibdev_dir("rdmap79s0")
    p5.set_port_state("rdmap79s0", "DOWN")
    assert read(ibdir, "ports/1/state") == "1: DOWN\n"
    assert read(ibdir, "ports/1/phys_state") == "3: Disabled\n"
    p5.set_port_state("rdmap79s0", "active")
    assert read(ibdir, "ports/1/state") == "4: ACTIVE\n"
    with pytest.raises(FakeHostError, match="port state"):
        p5.set_port_state("rdmap79s0", "SLEEPY")
    p5.set_efa_counter("rdmap79s0", "cmds_err", 3)
    assert read(ibdir, "hw_counters/cmds_err") == "3\n"
    p5.set_efa_counter("rdmap79s0", "rx_drops", 9, port=1)
    assert read(ibdir, "ports/1/hw_counters/rx_drops") == "9\n"
    with pytest.raises(FakeHostError, match="no_such"):
        p5.set_efa_counter("rdmap79s0", "no_such", 1)
    with pytest.raises(FakeHostError, match="rdmap1s0"):
        p5.set_port_state("rdmap1s0", "DOWN")
    assert not [p for p in tree(p5.root) if ".tmp-" in p]


def test_neuron_counter_dev_node_corrupt_write_boot_id(trn2: FakeHost) -> None:
    root = trn2.root
    trn2.set_neuron_counter(0, "stats/hardware/mem_ecc_uncorrected/total", 2)
    assert read(root, "sys/class/neuron_device/neuron0/stats/hardware/mem_ecc_uncorrected/total") == "2\n"
    with pytest.raises(FakeHostError, match="neuron0"):
        trn2.set_neuron_counter(0, "stats/nothing/here", 1)
    with pytest.raises(FakeHostError, match="Neuron device 5"):
        trn2.remove_neuron(5)
    trn2.remove_dev_node("/dev/neuron0")
    assert not (root / "dev/neuron0").exists()
    assert (root / "sys/class/neuron_device/neuron0/core_count").exists()
    trn2.restore_dev_node("/dev/neuron0")
    assert (root / "dev/neuron0").is_file()
    trn2.corrupt("/sys/class/neuron_device/neuron0/core_count", "eight")
    assert read(root, "sys/class/neuron_device/neuron0/core_count") == "eight"
    with pytest.raises(FakeHostError):
        trn2.corrupt("sys/class/neuron_device/neuron0/nope", "x")
    trn2.write("/opt/aws/neuron/logical_nc_config", "NEURON_LOGICAL_NC_CONFIG=1\n")
    assert read(root, "opt/aws/neuron/logical_nc_config") == "NEURON_LOGICAL_NC_CONFIG=1\n"
    trn2.set_boot_id("11111111-2222-3333-4444-555555555555")
    assert read(root, "proc/sys/kernel/random/boot_id") == "11111111-2222-3333-4444-555555555555\n"
    with pytest.raises(FakeHostError, match="inside"):
        trn2.write("../escape", "x")
    assert not (root.parent / "escape").exists()


def test_attach_reopens_cli_tree(tmp_path: Path) -> None:
    assert cli.main(["-t", "trn2.3xlarge", str(tmp_path)]) == 0
    host = FakeHost.attach(tmp_path)
    assert host.instance_type == "trn2.3xlarge" and host.efa_ibdevs == ["efa_0"]
    host.remove_efa("efa_0")
    assert not (tmp_path / "sys/class/infiniband/efa_0").exists()
    with pytest.raises(FakeHostError, match="marker"):
        FakeHost.attach(tmp_path / "sys")


# ------------------------------------------------------------------------------------------------ CLI


def test_cli_list(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["--list"]) == 0
    header, *lines = capsys.readouterr().out.splitlines()
    rows = {line.split()[0]: dict(zip(header.split(), line.split(), strict=True)) for line in lines}
    assert set(rows) == set(catalog.names()) and set(rows) >= set(EXPECTED_EFA)
    assert (rows["p6-b200.48xlarge"]["EFA"], rows["p6-b200.48xlarge"]["OTHER-RDMA"]) == ("8", "2")
    assert rows["trn2.48xlarge"]["NEURON"] == "16x8" and rows["trn2.48xlarge"]["LNC"] == "2"
    assert rows["c5.large"] == {"TYPE": "c5.large", "EFA": "0", "OTHER-RDMA": "0", "GPUS": "0", "NEURON": "-",
                                "LNC": "-"}


def test_cli_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["-t", "nope.large", str(tmp_path / "x")]) == 2
    assert "p5.48xlarge" in capsys.readouterr().err
    assert cli.main(["-t", "inf2.xlarge", "--lnc", "2", str(tmp_path / "x")]) == 2
    assert "inf2.xlarge" in capsys.readouterr().err
    assert cli.main(["-t", "inf2.xlarge"]) == 2
    out = tmp_path / "out"
    assert cli.main(["-t", "inf2.xlarge", "--no-efa", str(out)]) == 0
    assert cli.main(["-t", "inf2.xlarge", str(out)]) == 2
    assert "--force" in capsys.readouterr().err
    assert cli.main(["-t", "trn2.48xlarge", "--lnc", "1", "--force", str(out)]) == 0
    assert read(out, "sys/class/dmi/id/product_name") == "trn2.48xlarge\n"
    (out / "precious.txt").write_text("keep")
    assert cli.main(["-t", "c5.large", "--force", str(out)]) == 2
    assert "precious.txt" in capsys.readouterr().err
    assert (out / "precious.txt").read_text() == "keep"
    with pytest.raises(SystemExit) as info:
        cli.main(["-t", "trn2.48xlarge", "--lnc", "3", str(out)])
    assert info.value.code == 2
