#!/usr/bin/env bash
# What the made-up third accelerator costs (docs/architecture.md): the lines of its package, and every file
# outside the package that changed from the commit before the package was added to the last commit touching it
# (packaging, charts, Makefile, tests: everything, as git sees it).
#   scripts/count-accelerator.sh [PACKAGE_DIR]     # default tests/sample_accelerator
set -euo pipefail
cd "$(dirname "$0")/.."
pkg=${1:-tests/sample_accelerator}
added=$(git log --diff-filter=A --format=%H -- "$pkg" | tail -1)
[ -n "$added" ] || { echo "count-accelerator: $pkg is not in git history" >&2; exit 2; }
last=$(git log -1 --format=%H -- "$pkg")
echo "== $pkg: lines per file (git ls-files, wc -l)"
git ls-files -z "$pkg" | xargs -0 wc -l
echo "== daemon code (*.py): $(git ls-files -z "$pkg/*.py" | xargs -0 cat | wc -l) lines"
echo "== files outside $pkg changed from ${added:0:7}^ to ${last:0:7} (git diff --stat)"
git diff --stat "$added^" "$last" -- . ":(exclude)$pkg"
