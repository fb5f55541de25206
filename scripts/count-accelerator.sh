#!/usr/bin/env bash
# What the made-up third accelerator costs (docs/architecture.md): the lines of its package (Python, chart values,
# chart templates, the rest), and every file outside the package that a commit for it touched.
#
# A commit is for it when its message names it (its directory, distribution, Python packages, instance types, or
# "sample accelerator" / "third accelerator"): then every file the commit touched outside the package counts. A
# commit about something else, made since the package's first commit, counts only its hunks outside the package
# that add a line naming it (so a test changed because the accelerator is installed counts, e.g.
# tests/unit/test_fakehost.py in 6cf0525, but not the rest of that commit). Commits
# that changed the package for other work (renames in the core, a new core service) are listed apart: their
# package edits are in the package's lines, their other files are that work's cost, not the accelerator's.
#   scripts/count-accelerator.sh [PACKAGE_DIR]     # default tests/sample_accelerator
set -euo pipefail
cd "$(dirname "$0")/.."
pkg=${1:-tests/sample_accelerator}
pkg=${pkg%/}
[[ -f "$pkg/pyproject.toml" ]] || { echo "count-accelerator: $pkg/pyproject.toml not found" >&2; exit 2; }
[[ -n "$(git log -1 --format=%H -- "$pkg")" ]] || { echo "count-accelerator: $pkg is not in git history" >&2; exit 2; }
outside=(-- . ":(exclude)$pkg")

# Its names: the directory, the distribution and its packages (pyproject.toml), its instance types (its catalog).
names=$(python3 - "$pkg" <<'EOF'
import re, sys, tomllib
from pathlib import Path
pkg = Path(sys.argv[1])
project = tomllib.loads((pkg / "pyproject.toml").read_text())
words = [str(pkg), project["project"]["name"], *project.get("tool", {}).get("setuptools", {}).get("packages", [])]
for catalog in pkg.rglob("*.yaml"):
    words += re.findall(r"^  ([a-z0-9][a-z0-9-]*\.[a-z0-9-]+):\s*$", catalog.read_text(), re.M)
print("|".join(re.escape(w) for w in dict.fromkeys(words)))
EOF
)
tmp=$(mktemp)
about="$names|sample accelerator|third[^.]{0,20} accelerator"

echo "== $pkg: lines per file (git ls-files, wc -l)"
git ls-files -z "$pkg" | xargs -0 wc -l
sum() { git ls-files -z "$pkg" | { grep -zE "$1" || true; } | xargs -0 -r cat | wc -l; }
py=$(sum '\.py$'); values=$(sum '/values\.yaml$'); tpl=$(sum '/templates/'); all=$(sum '.')
echo "== its Python $py, chart values $values, chart templates $tpl, everything else $((all - py - values - tpl)) lines"

echo "== its names: $names"
mapfile -t whole < <(git log --no-merges --format=%H -i -E --grep="$about")
first=$(git log --no-merges --format=%H -- "$pkg" | tail -n1)  # a passing mention before it existed is not for it
mapfile -t partial < <(git log --no-merges --format=%H -G"$names" "$first^..HEAD" "${outside[@]}")
{
  for c in "${whole[@]}"; do git show --numstat --format= "$c" "${outside[@]}"; done
  for c in "${partial[@]}"; do
    [[ " ${whole[*]} " == *" $c "* ]] && continue
    # only the hunks (no context) where this commit added a line naming it
    git show --format= --unified=0 "$c" "${outside[@]}" | awk -v re="$names" '
      function flush() {if (hit) {add[f] += a; del[f] += d; seen[f] = 1}; a = d = hit = 0}
      /^diff --git / {flush(); f = substr($4, 3); next} /^@@/ {flush(); next}
      /^\+\+\+ |^--- / {next} /^\+/ {a++; if ($0 ~ re) hit = 1} /^-/ {d++}
      END {flush(); for (f in seen) printf "%d\t%d\t%s\n", add[f], del[f], f}'
  done
} | awk '{add[$3] += $1; del[$3] += $2}
    function kind(f) {
      if (f ~ /^tests\//) return "tests"; if (f ~ /^(docs\/|README)/) return "docs"
      if (f ~ /^(bench\/|scripts\/count-accelerator)/) return "measuring it"; if (f == "Makefile") return "Makefile"
      return "code, charts, packaging" }
    END {for (f in add) {printf "  %s +%d -%d\n", f, add[f], del[f]; k = kind(f); n[k]++; l[k] += add[f] + del[f]; t++}
         printf "  %d file(s) outside the package:", t
         for (k in n) {printf "%s %s %d (%d lines)", sep, k, n[k], l[k]; sep = ";"}; printf "\n"}' |
  sort -k1,1 >"$tmp"
echo "== files outside $pkg touched for it (commits naming it: every file; others: their hunks naming it)"
grep -v ' file(s) outside' "$tmp" || true
grep ' file(s) outside' "$tmp" || echo "  0 file(s) outside the package"
rm -f "$tmp"
echo "== the commits (+ the whole commit, ~ only its hunks naming it)"
for c in "${whole[@]}"; do echo "  + $(git log -1 --format='%h %s' "$c" | cut -c1-110)"; done
for c in "${partial[@]}"; do
  [[ " ${whole[*]} " == *" $c "* ]] || echo "  ~ $(git log -1 --format='%h %s' "$c" | cut -c1-110)"
done
echo "== commits that changed the package for other work (not counted outside it)"
git log --no-merges --format=%H -- "$pkg" | while read -r c; do
  [[ " ${whole[*]} ${partial[*]} " == *" $c "* ]] || echo "    $(git log -1 --format='%h %s' "$c" | cut -c1-110)"
done
