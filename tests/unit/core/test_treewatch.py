"""The shared-tree tripwire (tests/treewatch.py) must see every kind of change a test could make to a tree it was
only meant to read, and nothing else: a miss would let a polluting test pass, a false alarm fail a good one."""

from __future__ import annotations

import os
from pathlib import Path

from treewatch import TreeWatch


def test_reads_do_not_trip_and_every_change_does(tmp_path: Path) -> None:
    root = tmp_path / "tree"
    (root / "sys" / "class").mkdir(parents=True)
    attr = root / "sys" / "class" / "state"
    attr.write_text("4: ACTIVE\n")
    other = tmp_path / "elsewhere"
    other.mkdir()
    watch = TreeWatch()
    assert watch.watch(root)
    assert watch.tripped() == set()
    attr.read_text()
    os.listdir(root / "sys")
    (other / "x").write_text("x")  # outside the tree
    assert watch.tripped() == set()
    changes = [
        lambda: attr.write_text("1: DOWN\n"),
        lambda: os.chmod(attr, 0o600),
        lambda: (root / "sys" / "new").mkdir(),
        lambda: os.rename(root / "sys" / "new", root / "sys" / "renamed"),
        lambda: (root / "sys" / "renamed").rmdir(),
        lambda: os.symlink("/nowhere", root / "sys" / "class" / "link"),
    ]
    for change in changes:
        change()
        assert watch.tripped() == {root}
