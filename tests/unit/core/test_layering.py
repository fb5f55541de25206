"""The shape the design asks for, checked on the source: the generic core knows no accelerator, the two accelerator
packages do not import each other, and production code never imports the fake host or the dev tools (an
accelerator's own fake-host part, the module its declaration names, is dev-only too)."""

from __future__ import annotations

import ast
from pathlib import Path

from accel_core.registry import accelerators

REPO = Path(__file__).resolve().parents[3]
#: this repository's accelerator packages, as their registry declarations name them
PACKAGES = tuple(p for acc in accelerators() if acc.distribution == "aws-accel-agents" for p in acc.packages)
#: the accelerators' fake-host parts (``efa_plugin.fakehost``): dev-only, beside the fake host they plug into
PARTS = tuple(acc.fakehost.partition(":")[0] for acc in accelerators()
              if acc.distribution == "aws-accel-agents" and acc.fakehost)
DEV_ONLY = ("accel_core.fakehost", "accel_rig", *PARTS)


def imports(package: str) -> dict[str, set[str]]:
    """Module file -> the modules it imports (absolute names)."""
    out: dict[str, set[str]] = {}
    for path in sorted((REPO / package).rglob("*.py")):
        if path.name.endswith(("_pb2.py", "_pb2_grpc.py")):
            continue
        found: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                found.update(a.name for a in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                found.add(node.module)
        out[str(path.relative_to(REPO))] = found
    return out


def offenders(package: str, forbidden: tuple[str, ...], *, skip: tuple[str, ...] = ()) -> list[str]:
    return [f"{module} imports {name}" for module, names in imports(package).items()
            if not module.startswith(skip) for name in sorted(names) if name.startswith(forbidden)]


def test_the_registry_finds_the_packages_on_disk() -> None:
    assert len(PACKAGES) >= 2 and all((REPO / p / "__init__.py").is_file() for p in PACKAGES), PACKAGES


def test_the_core_knows_no_accelerator() -> None:
    # the dev tools (demo, cluster) wire real daemons together, so they may; nothing else in the core does
    assert offenders("accel_core", PACKAGES, skip=("rig/accel_rig/",)) == []


def test_accelerator_packages_do_not_import_each_other() -> None:
    for package in PACKAGES:
        assert offenders(package, tuple(p for p in PACKAGES if p != package)) == []


def test_production_never_imports_the_fake_host_or_dev_tools() -> None:
    assert PARTS, "the accelerators declare their fake-host parts"
    part_files = tuple(part.replace(".", "/") + ".py" for part in PARTS)
    found = [o for package in PACKAGES for o in offenders(package, DEV_ONLY, skip=part_files)]
    found += offenders("accel_core", DEV_ONLY, skip=("accel_core/fakehost/", "rig/accel_rig/"))
    assert found == []


def test_a_dra_driver_is_a_profile_and_a_three_line_cli() -> None:
    # what a second driver added: a profile and a CLI naming it; no DRA machinery of its own
    for package in [f"{p}/dra" for p in PACKAGES if (REPO / p / "dra").is_dir()]:
        modules = {p.name for p in (REPO / package).glob("*.py")}
        for machinery in ("preparation.py", "store.py", "cleanup.py", "claims.py", "daemon.py", "prepared.py"):
            assert machinery not in modules, f"{package}/{machinery}: driver machinery belongs in accel_core/dra"
        cli = (REPO / package / "cli.py").read_text()
        assert "DriverCli(" in cli and "argparse" not in cli


def test_the_extender_uses_no_device_plugin_internals() -> None:
    # the connected-set code both use lives in neuron_dra/allocation.py
    assert offenders("neuron_dra/extender", ("neuron_dra.deviceplugin",)) == []


def test_a_device_plugin_and_a_dra_driver_share_their_accelerators_scanner() -> None:
    # the host side (discovery, health, watch paths, health files, guard) is wired in one scanner per accelerator
    for package, scanner in (("efa_plugin", "efa_plugin.scanner"), ("neuron_dra", "neuron_dra.scanner")):
        found = imports(package)
        users = {m for m, names in found.items() if scanner in names}
        assert any("/dra/" in m for m in users) and any("/dra/" not in m for m in users), (package, users)
        wiring = [m for m, names in found.items() if "accel_core.coexistence" in names and not m.endswith(
            ("scanner.py", "__init__.py"))]
        assert wiring == [], f"{package}: the coexistence guard belongs to the scanner: {wiring}"


def test_a_device_plugin_cli_is_a_declaration() -> None:
    # the command line (flags, env, ls/serve dispatch, signals, exit codes) is accel_core.deviceplugin.cli's
    for path in ("efa_plugin/cli.py", "neuron_dra/deviceplugin/cli.py"):
        cli = (REPO / path).read_text()
        assert "DevicePluginCli(" in cli
        for machinery in ("add_subparsers", "add_env_argument", "run_daemon", "catch_stop_signals"):
            assert machinery not in cli, f"{path}: {machinery} belongs in accel_core/deviceplugin/cli.py"
