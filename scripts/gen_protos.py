#!/usr/bin/env python3
"""Generate the Python protobuf/gRPC modules for the kubelet APIs.

Every ``protos/*.proto`` file is compiled with ``python -m grpc_tools.protoc``
(``--python_out``, ``--grpc_python_out``, ``--pyi_out``) into
``accel_core/kubeletapi/``. protoc writes top-level imports between generated
modules (``import dra_v1_pb2 as ...``); those are rewritten into relative
imports so the modules work from the installed package.

Usage::

    python scripts/gen_protos.py            # regenerate the committed files
    python scripts/gen_protos.py --check    # exit 1 if they are out of date
"""

from __future__ import annotations

import argparse
import difflib
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
PROTO_DIR = REPO_ROOT / "protos"
OUTPUT_DIR = REPO_ROOT / "accel_core" / "kubeletapi"

# File name endings protoc produces; anything else in OUTPUT_DIR is hand-written.
GENERATED_SUFFIXES = ("_pb2.py", "_pb2.pyi", "_pb2_grpc.py")

_IMPORT_AS = re.compile(r"^import (?P<module>\w+) as (?P<alias>\w+)$", re.MULTILINE)
_FROM_IMPORT = re.compile(r"^from (?P<module>\w+) import ", re.MULTILINE)


class GenerationError(RuntimeError):
    """protoc failed or the proto directory is unusable."""


def proto_files(proto_dir: Path = PROTO_DIR) -> list[Path]:
    """Return the .proto files to compile, sorted for a stable order."""
    files = sorted(proto_dir.glob("*.proto"))
    if not files:
        raise GenerationError(f"no .proto files found in {proto_dir}")
    return files


def is_generated(path: Path) -> bool:
    """Tell whether *path* is a protoc output file (by its name)."""
    return path.name.endswith(GENERATED_SUFFIXES)


def relativize_imports(source: str, local_modules: set[str]) -> str:
    """Rewrite absolute imports of sibling generated modules into relative ones."""

    def import_as(match: re.Match[str]) -> str:
        module, alias = match.group("module"), match.group("alias")
        if module not in local_modules:
            return match.group(0)
        return f"from . import {module} as {alias}"

    def from_import(match: re.Match[str]) -> str:
        module = match.group("module")
        if module not in local_modules:
            return match.group(0)
        return f"from .{module} import "

    return _FROM_IMPORT.sub(from_import, _IMPORT_AS.sub(import_as, source))


def run_protoc(out_dir: Path, proto_dir: Path = PROTO_DIR) -> None:
    """Compile every proto in *proto_dir* into *out_dir* with grpc_tools.protoc."""
    command = [
        sys.executable,
        "-m",
        "grpc_tools.protoc",
        f"--proto_path={proto_dir}",
        f"--python_out={out_dir}",
        f"--grpc_python_out={out_dir}",
        f"--pyi_out={out_dir}",
        *(path.name for path in proto_files(proto_dir)),
    ]
    result = subprocess.run(command, cwd=proto_dir, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise GenerationError(f"protoc failed (exit {result.returncode}):\n{result.stderr.strip()}")


def generate(out_dir: Path, proto_dir: Path = PROTO_DIR) -> list[Path]:
    """Generate all modules into *out_dir* and fix their imports; return the files written."""
    out_dir.mkdir(parents=True, exist_ok=True)
    run_protoc(out_dir, proto_dir)
    generated = sorted(path for path in out_dir.iterdir() if is_generated(path))
    local_modules = {path.name.split(".")[0] for path in generated}
    for path in generated:
        text = path.read_text(encoding="utf-8")
        fixed = relativize_imports(text, local_modules)
        if fixed != text:
            path.write_text(fixed, encoding="utf-8")
    return generated


def _generated_files(directory: Path) -> dict[str, Path]:
    if not directory.is_dir():
        return {}
    return {path.name: path for path in directory.iterdir() if is_generated(path)}


def compare(expected_dir: Path, actual_dir: Path) -> list[str]:
    """Describe how the generated files in *actual_dir* differ from *expected_dir*."""
    expected = _generated_files(expected_dir)
    actual = _generated_files(actual_dir)
    problems: list[str] = []
    for name in sorted(expected.keys() - actual.keys()):
        problems.append(f"missing: {name}")
    for name in sorted(actual.keys() - expected.keys()):
        problems.append(f"stale (no longer generated): {name}")
    for name in sorted(expected.keys() & actual.keys()):
        want = expected[name].read_text(encoding="utf-8").splitlines()
        have = actual[name].read_text(encoding="utf-8").splitlines()
        if want == have:
            continue
        diff = list(difflib.unified_diff(have, want, f"committed/{name}", f"generated/{name}", lineterm=""))
        changed = sum(1 for line in diff if line[:1] in "+-" and line[:3] not in ("+++", "---"))
        problems.append(f"differs: {name} ({changed} changed lines)\n" + "\n".join(diff[:20]))
    return problems


def check(output_dir: Path = OUTPUT_DIR, proto_dir: Path = PROTO_DIR) -> list[str]:
    """Regenerate into a temporary directory and compare with *output_dir*.

    Returns a list of human-readable differences; empty means up to date.
    """
    with tempfile.TemporaryDirectory(prefix="gen_protos_") as tmp:
        fresh = Path(tmp)
        generate(fresh, proto_dir)
        return compare(fresh, output_dir)


def write(output_dir: Path = OUTPUT_DIR, proto_dir: Path = PROTO_DIR) -> list[Path]:
    """Regenerate into *output_dir*, removing generated files no longer produced."""
    with tempfile.TemporaryDirectory(prefix="gen_protos_") as tmp:
        fresh = Path(tmp)
        generated = generate(fresh, proto_dir)
        output_dir.mkdir(parents=True, exist_ok=True)
        wanted = {path.name for path in generated}
        for name, stale in _generated_files(output_dir).items():
            if name not in wanted:
                stale.unlink()
        for path in generated:
            shutil.copyfile(path, output_dir / path.name)
    return [output_dir / path.name for path in generated]


def main(argv: list[str] | None = None) -> int:
    """Command-line entry point."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument(
        "--check",
        action="store_true",
        help="do not write; exit 1 if the committed generated files are out of date",
    )
    args = parser.parse_args(argv)
    try:
        if args.check:
            problems = check()
            if problems:
                print(f"{OUTPUT_DIR} is out of date; run scripts/gen_protos.py", file=sys.stderr)
                for problem in problems:
                    print(problem, file=sys.stderr)
                return 1
            print(f"{OUTPUT_DIR}: generated files are up to date")
            return 0
        written = write()
    except (GenerationError, OSError) as exc:
        print(f"gen_protos: {exc}", file=sys.stderr)
        return 2
    for path in written:
        print(f"wrote {path.relative_to(REPO_ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
