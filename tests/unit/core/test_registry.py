"""The accelerator registry (accel_core/registry.py): one declaration per accelerator, collisions refused, and
each daemon's defaults taken from its declaration. Expected ports are the charts' values (what users install)."""

from __future__ import annotations

from importlib.metadata import entry_points
from pathlib import Path

import pytest
import yaml

from accel_core.awsfacts import catalog
from accel_core.registry import Accelerator, Daemon, RegistryError, accelerators, check, load_ref

REPO = Path(__file__).resolve().parents[3]


def test_two_daemons_on_one_port_are_refused_naming_both() -> None:
    a = Accelerator("a", ("a",), (Daemon("a-plugin", "a:main", metrics_port=9900),))
    b = Accelerator("b", ("b",), (Daemon("b-driver", "b:main", metrics_port=9901, health_port=9900),))
    with pytest.raises(RegistryError, match=r"port 9900 .*a/a-plugin \(metrics\).*b/b-driver \(health\)"):
        check((a, b))


def test_a_catalog_section_claimed_twice_is_refused() -> None:
    a = Accelerator("a", ("a",), catalog_sections={"x": "m:A"})
    b = Accelerator("b", ("b",), catalog_sections={"x": "m:B"})
    with pytest.raises(RegistryError, match="catalog section 'x' is claimed by both a and b"):
        check((a, b))


def test_a_pod_network_daemon_does_not_take_a_node_port() -> None:
    a = Accelerator("a", ("a",), (Daemon("a-plugin", "a:main", metrics_port=9900),))
    b = Accelerator("b", ("b",), (Daemon("b-extender", "b:main", metrics_port=9900, on_node=False),))
    check((a, b))


def test_the_installed_declarations_do_not_collide_and_match_the_console_scripts() -> None:
    accels = accelerators()
    assert {"efa", "neuron"} <= {a.name for a in accels}
    installed = {e.name: e.value for e in entry_points(group="console_scripts")}
    for acc in accels:
        for d in acc.daemons:
            assert installed.get(d.script) == d.target, f"{acc.name}: {d.script} is not the installed script"


def _chart_values(chart: str) -> dict[str, object]:
    return dict(yaml.safe_load((REPO / "charts" / chart / "values.yaml").read_text()))


def test_each_dra_driver_defaults_to_its_own_chart_liveness_port() -> None:
    # The charts give the Neuron DRA driver 51515 and the EFA one 51516: both on one node (hostNetwork) must not
    # collide, with or without a chart setting the port.
    efa = _chart_values("aws-efa-k8s-device-plugin")["draDriver"]
    neuron = _chart_values("neuron-helm-chart")["draDriver"]
    expected = {"efa-dra-driver": efa["healthcheckPort"], "neuron-dra-driver": neuron["healthcheckPort"]}  # type: ignore[index]
    for script, port in expected.items():
        cli = load_ref(next(d.target for a in accelerators() for d in a.daemons if d.script == script)
                       .replace(":main", ":CLI"))
        assert cli.parser().parse_args(["serve", "--node-name", "n1"]).healthcheck_port == port, script


def test_a_section_no_accelerator_declares_names_the_file_and_type(tmp_path: Path) -> None:
    bad = tmp_path / "cat.yaml"
    bad.write_text("types:\n  z1.big:\n    family: z1\n    tpu: {count: 4}\n")
    with pytest.raises(catalog.CatalogError, match=rf"{bad}: z1\.big: unknown section 'tpu'"):
        catalog.load(bad)


def test_a_wrong_field_type_names_the_file_type_and_path(tmp_path: Path) -> None:
    bad = tmp_path / "cat.yaml"
    bad.write_text("types:\n  z1.big:\n    family: z1\n    efa: {pci_device_id: '0xefa1', rate: x, devices: "
                   "[{ibdev: e0, bdf: '0000:10:00.0', root: pci0000:10, numa: zero}]}\n")
    with pytest.raises(catalog.CatalogError) as err:
        catalog.load(bad)
    assert str(err.value).startswith(f"{bad}: z1.big: ") and "efa.devices[0].numa" in str(err.value)
    assert "\n" not in str(err.value)
