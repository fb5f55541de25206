"""Issue 33 items 4-6: another package's accelerator cannot take a daemon down or replace one of ours.

The packages here are real distributions (a ``*.dist-info`` with ``entry_points.txt`` beside the module) put on
``sys.path``, found by :mod:`importlib.metadata` as pip would install them. Expected claims are our declarations'
(efa_plugin/accelerator.py, neuron_dra/accelerator.py): section ``efa`` decoded by ``EfaSection``, the Neuron device
plugin on metrics port 9811."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from accel_pkgs import write_package

from accel_core import registry
from accel_core.registry import Accelerator, Daemon, RegistryError, check

EFA_SECTION = "efa_plugin.facts:EfaSection"


@pytest.fixture
def fresh_registry(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The registry reloaded for the test and reloaded again after it (nothing it loaded leaks into other tests)."""
    monkeypatch.setattr(registry, "_serving", None)
    monkeypatch.setattr(registry, "_logged", set())
    registry.accelerators.cache_clear()
    modules = set(sys.modules)
    yield
    for name in set(sys.modules) - modules:  # the test's packages: the next test writes others of the same name
        if name.split(".")[0].endswith("_accel"):
            del sys.modules[name]
    registry.accelerators.cache_clear()


def _lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "accel_core.registry"]


# ----------------------------------------------------------------------------------- the duplicate check (item 6)

def test_a_second_declaration_named_efa_collides_on_its_name() -> None:
    ours = Accelerator("efa", ("efa_plugin",), catalog_sections={"efa": EFA_SECTION}, distribution="aws-accel-agents")
    impostor = Accelerator("efa", ("evil",), distribution="evil-accel")
    with pytest.raises(RegistryError, match="accelerator efa is claimed by both efa of aws-accel-agents and efa of "
                                            "evil-accel"):
        check((ours, impostor))


@pytest.mark.parametrize(("impostor", "claim"), [
    (Accelerator("x", ("evil",), catalog_sections={"efa": "evil:S"}), "catalog section 'efa'"),
    (Accelerator("x", ("evil",), (Daemon("efa-device-plugin", "evil:main", metrics_port=0),)),
     "console script efa-device-plugin"),
    (Accelerator("x", ("evil",), (Daemon("evil-plugin", "evil:main", metrics_port=9810),)), "port 9810"),
])
def test_every_kind_of_claim_collides_whatever_the_names(impostor: Accelerator, claim: str) -> None:
    ours = Accelerator("efa", ("efa_plugin",), (Daemon("efa-device-plugin", "efa_plugin.cli:main", 9810),),
                       catalog_sections={"efa": EFA_SECTION})
    with pytest.raises(RegistryError, match=claim):
        check((ours, impostor))


def test_one_declaration_claiming_a_port_twice_is_refused() -> None:
    acc = Accelerator("a", ("a",), (Daemon("a-plugin", "a:main", 9900), Daemon("a-driver", "a:main", 9900)))
    with pytest.raises(RegistryError, match=r"port 9900 is claimed by both a/a-plugin \(metrics\) and a/a-driver"):
        check((acc,))


# ------------------------------------------------------------------------------- loading in isolation (items 4-5)

BROKEN = {
    "imperr": "import no_such_module_for_the_test\n",
    "sysexit": "import sys\nsys.exit(0)\n",
    "baseexc": "raise BaseException('at import')\n",
    "wrongtype": "ACCELERATOR = 42\n",
}


@pytest.mark.parametrize("kind", sorted(BROKEN))
def test_a_package_that_fails_at_import_is_one_line_and_left_out(kind: str, tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch,
                                                                  caplog: pytest.LogCaptureFixture,
                                                                  fresh_registry: None) -> None:
    write_package(tmp_path, f"bad{kind}", BROKEN[kind])
    monkeypatch.syspath_prepend(str(tmp_path))
    names = [a.name for a in registry.accelerators()]
    assert {"efa", "neuron"} <= set(names) and f"bad{kind}" not in names
    registry.accelerators.cache_clear()
    registry.accelerators()  # loaded again: still one line
    (line,) = _lines(caplog)
    assert f"entry point bad{kind} (bad{kind}_accel:ACCELERATOR) of bad{kind}-accel" in line, line
    assert "\n" not in line


def test_an_impostor_named_efa_cannot_replace_our_catalog_section(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                   caplog: pytest.LogCaptureFixture,
                                                                   fresh_registry: None) -> None:
    # "aaa" sorts before "efa": it would be loaded first if entry-point names decided the order
    write_package(tmp_path, "aaa", "from accel_core.registry import Accelerator\n"
                  "ACCELERATOR = Accelerator('efa', ('aaa_accel',), catalog_sections={'efa': 'aaa_accel:S'})\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    efa = [a for a in registry.accelerators() if a.name == "efa"]
    assert [(a.distribution, dict(a.catalog_sections)["efa"]) for a in efa] == [("aws-accel-agents", EFA_SECTION)]
    (line,) = _lines(caplog)
    assert "accelerator efa is claimed by both efa of aws-accel-agents and efa of aaa-accel" in line


def test_a_daemon_uses_only_ours_and_its_own(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                             fresh_registry: None) -> None:
    # a valid package the Neuron daemon does not serve: its section is never asked for (its module does not exist)
    write_package(tmp_path, "other", "from accel_core.registry import Accelerator\n"
                  "ACCELERATOR = Accelerator('other', ('other_accel',), catalog_sections={'zz': 'nowhere:S'})\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert "other" in [a.name for a in registry.accelerators()]  # a tool sees every accelerator
    own = registry.serve_as("neuron-device-plugin")
    assert own.name == "neuron" and own.distribution == "aws-accel-agents"
    assert sorted(a.name for a in registry.accelerators()) == ["efa", "neuron"]


@pytest.mark.parametrize(("body", "claim"), [
    ("ACCELERATOR = Accelerator('nx', ('neuronish_accel',), catalog_sections={'neuron': 'x:S'})",
     "catalog section 'neuron'"),
    ("ACCELERATOR = Accelerator('nx', ('neuronish_accel',), (Daemon('nx-plugin', 'x:main', 9811),))", "port 9811"),
    ("ACCELERATOR = Accelerator('neuron', ('neuronish_accel',))", "accelerator neuron"),
])
def test_a_collision_with_the_daemons_own_is_refused_and_with_another_ignored(
        body: str, claim: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fresh_registry: None) -> None:
    write_package(tmp_path, "neuronish", f"from accel_core.registry import Accelerator, Daemon\n{body}\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(RegistryError, match=claim) as err:
        registry.serve_as("neuron-device-plugin")
    assert "neuronish-accel" in str(err.value) and "\n" not in str(err.value)
    assert registry.serve_as("efa-device-plugin").name == "efa"  # the EFA daemon is not concerned


def test_a_daemon_whose_own_package_is_broken_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                         fresh_registry: None) -> None:
    write_package(tmp_path, "mine", "import sys\nsys.exit(0)\n", scripts={"mine-device-plugin": "mine_accel:main"})
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(RegistryError, match=r"entry point mine .* cannot be loaded: SystemExit: 0"):
        registry.serve_as("mine-device-plugin")
    with pytest.raises(RegistryError, match="no installed accelerator declares the console script 'nobody'"):
        registry.serve_as("nobody")
