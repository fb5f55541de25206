#!/usr/bin/env bash
# Build and cache tools/cdicheck, the CDI oracle of the tests: it loads CDI specs with
# tags.cncf.io/container-device-interface pkg/cdi (the library containerd injects CDI devices with), fetched from
# the Go module proxy at the version tools/cdicheck/go.mod pins.
#
# Usage: scripts/build-cdicheck.sh [--print-path]
# Env:   ACCEL_TOOLS_CACHE (default: ${XDG_CACHE_HOME:-~/.cache}/aws-accel-agents/tools)
# The binary lands in $ACCEL_TOOLS_CACHE/cdicheck-<hash of its sources>/cdicheck; a second run is a no-op, and a
# change to the sources builds a new one.
set -euo pipefail

GO_MIN=1.26
SRC="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)/tools/cdicheck"
CACHE=${ACCEL_TOOLS_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/aws-accel-agents/tools}
SUM=$( (cd "$SRC" && cat go.mod go.sum ./*.go | sha256sum | cut -c1-16) )
ROOT="$CACHE/cdicheck-$SUM"
BIN="$ROOT"
OUT="$BIN/cdicheck"

if [[ "${1:-}" == "--print-path" ]]; then echo "$OUT"; exit 0; fi
if [[ -x "$OUT" ]]; then echo "cdicheck cached at $OUT"; exit 0; fi

NAME=build-cdicheck
KUBE_VERSION=unused  # gobuild-lib.sh derives staging tags from it; cdicheck needs none
# shellcheck source=scripts/gobuild-lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/gobuild-lib.sh"
go_build_env
if [[ -x "$OUT" ]]; then echo "cdicheck cached at $OUT"; exit 0; fi

echo "build-cdicheck: building $SRC"
(cd "$SRC" && run "go build cdicheck" "$ROOT/log/build.log" \
  go build -mod=readonly -trimpath -ldflags "-s -w" -o "$OUT.tmp" .)
mv "$OUT.tmp" "$OUT"
echo "build-cdicheck: $OUT"
