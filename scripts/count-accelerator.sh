#!/usr/bin/env bash
# What the made-up third accelerator costs (docs/architecture.md): the lines of its package, and every file
# outside the package that the commits adding or changing it touched (packaging, charts, Makefile, tests:
# everything, as git sees it; merges and unrelated commits in between are not its cost).
#   scripts/count-accelerator.sh [PACKAGE_DIR]     # default tests/sample_accelerator
set -euo pipefail
cd "$(dirname "$0")/.."
pkg=${1:-tests/sample_accelerator}
commits=$(git log --no-merges --format=%H -- "$pkg")
[ -n "$commits" ] || { echo "count-accelerator: $pkg is not in git history" >&2; exit 2; }
echo "== $pkg: lines per file (git ls-files, wc -l)"
git ls-files -z "$pkg" | xargs -0 wc -l
echo "== its Python (both daemons, scanner, host files, facts): $(git ls-files -z "$pkg/*.py" | xargs -0 cat | wc -l) lines"
echo "== files outside $pkg touched by its $(echo "$commits" | wc -l) commit(s) (git log --numstat: added, removed)"
for c in $commits; do git show --numstat --format= "$c" -- . ":(exclude)$pkg"; done |
    awk '{add[$3] += $1; del[$3] += $2} END {n = 0; for (f in add) {printf "  %s +%d -%d\n", f, add[f], del[f]; n++}
         printf "  %d file(s) outside the package\n", n}'
