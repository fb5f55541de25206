"""Core code names no accelerator: the product core (``accel_core``) and the dev rig (``rig/accel_rig``) learn of EFA,
Neuron or any other accelerator only through the registry (accel_core/registry.py). Checked on the code itself:
every identifier and every string literal that is not a docstring; comments and docstrings may give examples.

A name is an accelerator's when, read as words (``neuron_count``, ``EfaPart`` -> ``efa part``), it has one of
:data:`WORDS`. The exceptions below say why each may.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]
CORE = (REPO / "accel_core", REPO / "rig" / "accel_rig")

#: EFA and Neuron words, their instance families (trn2, inf1, p5, p4d, p6-b200...), and Neuron-only settings
WORDS = re.compile(r"(?<![a-z0-9])(efa|neuron[a-z0-9]*|trainium\d*|inferentia\d*|trn\d[a-z0-9-]*|inf\d[a-z0-9-]*|"
                   r"p[3-6][a-z0-9-]*\.\d*x?large|ultraserver[a-z0-9]*|lnc)(?![a-z0-9])")

#: file (relative to the repository) -> why it may name accelerators
EXCEPTIONS = {
    "accel_core/awsfacts/neuron_efa.py": (
        "the AWS Neuron-to-EFA tables and devicegroup hashing: one fact of two accelerators. Both DRA drivers must "
        "publish equal devicegroup ids (a cross-driver matchAttribute) and the EFA device plugin ranks by Neuron "
        "proximity, and efa_plugin and neuron_dra may not import each other (test_layering), so the one copy sits "
        "in the core both import"),
    "rig/accel_rig/demo.py": (
        "`make demo` is the show-case of this project's two accelerators: it starts their daemons by name and "
        "prints their devices, as a user walking through EFA and Neuron would"),
}


def _words(name: str) -> str:
    """``EfaPart`` -> ``efa_part``; ``neuron_count`` stays: words a regex can find with boundaries."""
    return re.sub(r"(?<=[a-z0-9])(?=[A-Z])", "_", name).lower()


def _docstrings(tree: ast.AST) -> set[int]:
    """ids of the string constants that are statements of their own (docstrings, attribute docs)."""
    return {id(node.value) for node in ast.walk(tree) if isinstance(node, ast.Expr)
            and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str)}


def names_in_code(path: Path) -> Iterator[tuple[int, str]]:
    """``(line, text)`` of every identifier and non-docstring string literal of a module."""
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    docs = _docstrings(tree)
    for node in ast.walk(tree):
        line = getattr(node, "lineno", 0)
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docs:
            yield line, node.value
        elif isinstance(node, ast.Name):
            yield line, node.id
        elif isinstance(node, ast.Attribute):
            yield line, node.attr
        elif isinstance(node, ast.arg | ast.keyword) and node.arg:
            yield line, node.arg
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            yield line, node.name
        elif isinstance(node, ast.alias):
            yield line, f"{node.name} {node.asname or ''}"
        elif isinstance(node, ast.ImportFrom) and node.module:
            yield line, node.module


def offenders() -> list[str]:
    out = []
    for base in CORE:
        for path in sorted(base.rglob("*.py")):
            rel = str(path.relative_to(REPO))
            if rel in EXCEPTIONS or path.name.endswith(("_pb2.py", "_pb2_grpc.py")):
                continue
            out += [f"{rel}:{line}: {text!r}" for line, text in names_in_code(path) if WORDS.search(_words(text))]
    return sorted(set(out))


def test_core_code_names_no_accelerator() -> None:
    assert offenders() == []


def test_the_check_finds_what_it_should() -> None:
    # the words as code spells them, and what is no accelerator's (default, infiniband-free RDMA, efa as a prefix)
    for name in ("efa", "EfaPart", "neuron_count", "NEURONCORE", "trn2u.48xlarge", "p5.48xlarge", "inf2", "lnc",
                 "set_ultraserver", "p6-b200.48xlarge", "Trainium2"):
        assert WORDS.search(_words(name)), name
    for name in ("default", "defaults", "refactor", "info", "p5", "uverbs"):
        assert not WORDS.search(_words(name)), name
    assert all((REPO / rel).is_file() for rel in EXCEPTIONS), "an exception names a file that is gone"
