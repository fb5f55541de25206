#!/usr/bin/env bash
# Put each chart's local (file://) dependencies into its charts/ directory, as `helm dependency build` would, but as
# plain directories and with no helm, network or Chart.lock: helm loads them as they are, and prints nothing about
# them (a symlink there made it warn "found symbolic link in path" on every command). The copies are build outputs
# (charts/.gitignore); `make setup` and every pytest run refresh them, so an edit of charts/accel-dra-lib is seen
# by the next render. Without this script, `helm dependency build charts/<chart>` does the same job.
#   scripts/chart-deps.sh [CHART_DIR...]     # default: every chart under charts/
set -euo pipefail
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$REPO"
[[ $# -gt 0 ]] || set -- charts/*/
for chart in "$@"; do
  chart=${chart%/}
  [[ -f "$chart/Chart.yaml" ]] || { echo "chart-deps: $chart/Chart.yaml not found" >&2; exit 2; }
  # Chart.yaml's dependencies[].repository values of the form file://PATH (PATH relative to the chart).
  while read -r rel; do
    src="$chart/$rel"
    name=$(sed -n 's/^name: *//p' "$src/Chart.yaml" 2>/dev/null | head -n1)
    [[ -n "$name" ]] || { echo "chart-deps: $chart: dependency file://$rel has no Chart.yaml with a name" >&2; exit 2; }
    mkdir -p "$chart/charts"
    dest="$chart/charts/$name"
    (
      flock 9  # concurrent test workers refresh the same copy
      [[ ! -L "$dest" ]] || rm -f "$dest"  # the committed link of earlier checkouts
      if ! diff -rq "$src" "$dest" >/dev/null 2>&1; then
        tmp=$(mktemp -d "$(dirname "$chart")/.chart-deps.XXXXXX")  # outside every chart: helm loads all in it
        chmod 755 "$tmp"; cp -R "$src/." "$tmp/"
        rm -rf "$dest"; mv "$tmp" "$dest"
      fi
    ) 9<"$chart/Chart.yaml"
  done < <(sed -n 's|^ *repository: *["'\'']\{0,1\}file://\([^"'\'' ]*\).*$|\1|p' "$chart/Chart.yaml")
done
