"""Third-party accelerator packages for the registry tests, written as pip installs them: the module beside a
``*.dist-info`` whose ``entry_points.txt`` declares it (group ``aws_accel_agents.accelerators``). Put the directory
on ``sys.path`` (or PYTHONPATH) and :mod:`importlib.metadata` finds it like any installed distribution."""

from __future__ import annotations

from pathlib import Path

from accel_core.registry import GROUP


def write_package(root: Path, name: str, body: str, *, scripts: dict[str, str] | None = None) -> Path:
    """Distribution ``<name>-accel`` with module ``<name>_accel`` (``body``) and entry point ``<name>``."""
    module = root / f"{name}_accel"
    module.mkdir(parents=True)
    (module / "__init__.py").write_text(body)
    info = root / f"{name}_accel-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}-accel\nVersion: 0.1\n")
    entries = f"[{GROUP}]\n{name} = {name}_accel:ACCELERATOR\n"
    if scripts:
        entries += "[console_scripts]\n" + "".join(f"{k} = {v}\n" for k, v in scripts.items())
    (info / "entry_points.txt").write_text(entries)
    return root
