"""No import cycles between the modules of the project's packages: every ``import`` counts, at module level, in a
function (a lazy import is a cycle put off, not removed) or under ``TYPE_CHECKING``."""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]
#: package -> the directory that holds it
PACKAGES = {"accel_core": REPO, "efa_plugin": REPO, "neuron_dra": REPO, "accel_rig": REPO / "rig"}


def modules() -> dict[str, Path]:
    out = {}
    for package, base in PACKAGES.items():
        for path in (base / package).rglob("*.py"):
            if not path.name.endswith(("_pb2.py", "_pb2_grpc.py")):
                parts = path.relative_to(base).with_suffix("").parts
                out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


def graph(mods: dict[str, Path]) -> dict[str, set[str]]:
    """Module -> the project modules it imports (``from a import b`` is ``a.b`` when that is a module)."""
    out: dict[str, set[str]] = {}
    for name, path in mods.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        found: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
            if isinstance(node, ast.Import):
                found.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    up = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join([*up, *([node.module] if node.module else [])])
                found.update(f"{base}.{a.name}" if f"{base}.{a.name}" in mods else base for a in node.names)
        edges = set()
        for target in found:
            while target and target not in mods:
                target = target.rpartition(".")[0]
            if target and target != name:
                edges.add(target)
        out[name] = edges
    return out


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(edges[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return found


def test_no_import_cycles() -> None:
    mods = modules()
    assert len(mods) > 100 and "accel_core.fakehost.builder" in mods
    assert cycles(graph(mods)) == []


def test_the_walk_finds_a_cycle_and_resolves_relative_imports(tmp_path: Path) -> None:
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "__init__.py").write_text("")
    (tmp_path / "pkg" / "a.py").write_text("def f():\n    from . import b\n")  # a lazy import counts
    (tmp_path / "pkg" / "b.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import pkg.a\n")
    (tmp_path / "pkg" / "c.py").write_text("from pkg.a import f\n")
    mods = {"pkg": tmp_path / "pkg/__init__.py", **{f"pkg.{m}": tmp_path / f"pkg/{m}.py" for m in "abc"}}
    edges = graph(mods)
    assert edges == {"pkg": set(), "pkg.a": {"pkg.b"}, "pkg.b": {"pkg.a"}, "pkg.c": {"pkg.a"}}
    assert cycles(edges) == [["pkg.a", "pkg.b"]]
