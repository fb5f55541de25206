"""The instance catalog is merged by type from the files of the accelerators that own its sections (EFA's
``efa_plugin/instances.yaml``, Neuron's ``neuron_dra/facts/instances.yaml``) and the catalog's own file; each file
is plain YAML (PyYAML), so any YAML layout of a type parses."""

from __future__ import annotations

from pathlib import Path

import pytest

import efa_plugin
import neuron_dra.facts
from accel_core.awsfacts import catalog
from accel_core.registry import accelerators

OWN = Path(catalog.__file__).with_name("instances.yaml")
EFA = Path(efa_plugin.__file__).with_name("instances.yaml")
NEURON = Path(neuron_dra.facts.__file__).with_name("instances.yaml")


def test_each_file_holds_only_its_owners_sections_and_the_merge_joins_them() -> None:
    declared = {acc.name: set(acc.catalog_sections) for acc in accelerators()}
    for path, owner in ((EFA, "efa"), (NEURON, "neuron")):
        for name, itype in catalog.load(path).items():
            assert set(itype.sections) <= declared[owner], (path, name)
    assert catalog.load(OWN)["c5.large"].sections == {}  # the catalog's own file: types with no accelerator
    trn2 = catalog.get("trn2.48xlarge")
    assert set(trn2.sections) == {"efa", "neuron"} and trn2.family == "trn2"
    assert len(trn2.efa.devices) == len(trn2.neuron.devices) == 16  # neuron.md section 3: 16 EFAs, 16 Trainium2
    ours = catalog.load(EFA, NEURON, OWN)  # the registered catalog adds other installed accelerators' types only
    assert len(ours) == 15 and all(catalog.get(name) == itype for name, itype in ours.items())


def test_files_that_disagree_on_a_family_or_repeat_a_section_are_refused(tmp_path: Path) -> None:
    a, b = tmp_path / "a.yaml", tmp_path / "b.yaml"
    a.write_text("types:\n  z1.big:\n    family: z1\n")
    b.write_text("types:\n  z1.big:\n    family: z2\n")
    with pytest.raises(catalog.CatalogError, match=rf"z1\.big: the files disagree on its family \({a}: z1; {b}: z2"):
        catalog.load(a, b)
    gpus = "    gpus: {model: X, pci_device_id: '0x1234'}\n"
    a.write_text("types:\n  z1.big:\n    family: z1\n" + gpus)
    b.write_text("types:\n  z1.big:\n    family: z1\n" + gpus)
    with pytest.raises(catalog.CatalogError, match=rf"{b}: z1\.big: section 'gpus' is given by another catalog file"):
        catalog.load(a, b)


@pytest.mark.parametrize("efa", [False, True], ids=["other-rdma-only", "with-efa"])
def test_an_rdma_device_name_given_twice_is_refused(tmp_path: Path, efa: bool) -> None:
    """Two RDMA devices of one host cannot share a name (/sys/class/infiniband/<name>), whichever sections they are
    in; a list section's items are checked like a section."""
    rdma = ("      - {ibdev: ibp1, bdf: '0000:73:00.0', root: pci0000:70, numa: 0, vendor: '0x15b3', device: '0x1021', "
            "driver: mlx5_core, node_type: '1: CA', link_layer: InfiniBand, rate: '400'}\n")
    other = "    other_rdma:\n" + rdma + rdma.replace("0000:73", "0000:74").replace("ibp1", "efa0" if efa else "ibp1")
    efa_section = ("    efa:\n      pci_device_id: '0xefa2'\n      rate: '400'\n      devices:\n"
                   "        - {ibdev: efa0, bdf: '0000:10:00.0', root: pci0000:10, numa: 0}\n") if efa else ""
    path = tmp_path / "t.yaml"
    path.write_text("types:\n  z1.big:\n    family: z1\n" + efa_section + other)
    with pytest.raises(catalog.CatalogError, match=r"z1\.big: duplicate ibdev name \['(efa0|ibp1)'\]"):
        catalog.load(path)


def test_any_yaml_layout_of_a_type_parses(tmp_path: Path) -> None:
    # flow style and odd indentation, which a line-based splitter of the file would have cut wrongly
    flow = tmp_path / "flow.yaml"
    flow.write_text("types: {z1.big: {family: z1, gpus: {model: X, pci_device_id: '0x1234', devices: [\n"
                    "   {index: 0, bdf: '0000:10:00.0', root: pci0000:10, numa: 0}]}},\n"
                    "        z1.small: {family: z1}}\n")
    found = catalog.load(flow)
    assert list(found) == ["z1.big", "z1.small"] and found["z1.big"].gpus.devices[0].pci.bdf == "0000:10:00.0"


def test_unknown_type_names_the_known_ones() -> None:
    with pytest.raises(KeyError) as err:
        catalog.get("x9.huge")
    assert "x9.huge" in str(err.value) and "trn2.48xlarge" in str(err.value)


def test_a_name_that_is_no_section_is_an_attribute_error() -> None:
    trn1 = catalog.get("trn1.2xlarge")
    assert trn1.efa is None and trn1.neuron is not None  # a registered section: None when the type has none
    with pytest.raises(AttributeError, match="'efa_count'.*known: efa, gpus, neuron, other_rdma"):
        _ = trn1.efa_count


@pytest.mark.parametrize(("text", "error"), [
    ("types: [\n", "not valid YAML: "),
    ("- a\n", "expected a mapping, got list"),
    ("defaults: [1]\ntypes: {}\n", "defaults: expected a mapping"),
    ("defaults: {}\n", "missing 'types'"),
    ("types:\n  z1.big: [1]\n", "z1.big: expected a mapping, got list"),
])
def test_a_malformed_file_is_one_line_naming_it(tmp_path: Path, text: str, error: str) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text(text)
    with pytest.raises(catalog.CatalogError) as err:
        catalog.load(bad)
    assert str(err.value).startswith(f"{bad}: {error}") and "\n" not in str(err.value), str(err.value)
