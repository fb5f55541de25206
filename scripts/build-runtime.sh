#!/usr/bin/env bash
# Build and cache the real container runtime of the rig's containerd nodes, with nothing installed into the system:
#   - containerd, containerd-shim-runc-v2 and ctr (github.com/containerd/containerd/v2, from the Go module proxy);
#   - runc, buildah, mmdebstrap and busybox-static (Debian packages, `apt-get install --download-only` into the cache,
#     then `dpkg-deb -x` into the cache's deb root; dpkg's own database is left as it was);
#   - a static pause binary (a few lines of C, `gcc -static`).
# The images (pause, busybox, the Debian Python base and the project image) are made from these by
# scripts/build-images.sh.
#
# Usage: scripts/build-runtime.sh [--print-dir]
# Env:   CONTAINERD_VERSION (v2.4.2)
#        ACCEL_RUNTIME_CACHE (default: ${XDG_CACHE_HOME:-~/.cache}/aws-accel-agents/runtime)
# Binaries land in $ACCEL_RUNTIME_CACHE/containerd<version>/bin (containerd, the shim, ctr, pause) and
# .../debroot/usr/bin (runc, buildah, mmdebstrap) and .../debroot/bin/busybox; a second run is a no-op.
set -euo pipefail

CONTAINERD_VERSION=${CONTAINERD_VERSION:-v2.4.2}
GO_MIN=1.26
KUBE_VERSION=none
CACHE=${ACCEL_RUNTIME_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/aws-accel-agents/runtime}
ROOT="$CACHE/containerd${CONTAINERD_VERSION}"
BIN="$ROOT/bin"
DEBROOT="$ROOT/debroot"
DEBS=(runc buildah mmdebstrap busybox-static)
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"

if [[ "${1:-}" == "--print-dir" ]]; then echo "$ROOT"; exit 0; fi

have_go() { for b in containerd containerd-shim-runc-v2 ctr; do [[ -x "$BIN/$b" ]] || return 1; done; }
have_debs() {
  for b in usr/bin/runc usr/bin/buildah usr/bin/mmdebstrap bin/busybox; do [[ -x "$DEBROOT/$b" ]] || return 1; done
}
have_all() { have_go && have_debs && [[ -x "$BIN/pause" ]]; }
if have_all; then echo "runtime cached in $ROOT"; exit 0; fi

NAME=build-runtime
# shellcheck source=scripts/gobuild-lib.sh
source "$HERE/gobuild-lib.sh"
go_build_env
if have_all; then echo "runtime cached in $ROOT"; exit 0; fi

build_containerd() {
  local mod="$ROOT/src/containerd"; mkdir -p "$mod"
  printf 'module accelcontainerdbuild\n\ngo %s\n' "$GO_MIN" >"$mod/go.mod"
  echo "build-runtime: building containerd $CONTAINERD_VERSION (slow the first time)"
  local pkg=github.com/containerd/containerd/v2
  (cd "$mod" && run "go get $pkg@$CONTAINERD_VERSION" "$ROOT/log/containerd-get.log" \
      go get "$pkg/cmd/containerd@$CONTAINERD_VERSION" \
    && run "go build containerd" "$ROOT/log/containerd-build.log" \
      go build -trimpath -tags "no_btrfs no_devmapper no_zfs" \
        -ldflags "-s -w -X $pkg/version.Version=$CONTAINERD_VERSION" \
        -o "$BIN/" "$pkg/cmd/containerd" "$pkg/cmd/containerd-shim-runc-v2" "$pkg/cmd/ctr")
}

# The Debian packages and whatever they need that this machine lacks, downloaded by apt into the cache (no install).
fetch_debs() {
  local archives="$ROOT/debs"; mkdir -p "$archives/partial" "$DEBROOT"
  echo "build-runtime: downloading ${DEBS[*]} (Debian packages, into the cache only)"
  if ! apt-get install --download-only --no-install-recommends --reinstall -y -q \
      -o Dir::Cache::archives="$archives" "${DEBS[@]}" >"$ROOT/log/apt.log" 2>&1; then
    # A new machine may have no package lists yet.
    run "apt-get update" "$ROOT/log/apt-update.log" apt-get update -q
    run "apt-get download" "$ROOT/log/apt.log" apt-get install --download-only --no-install-recommends \
      --reinstall -y -q -o Dir::Cache::archives="$archives" "${DEBS[@]}"
  fi
  local deb
  for deb in "$archives"/*.deb; do dpkg-deb -x "$deb" "$DEBROOT"; done
  # The exact versions, for the record.
  for deb in "$archives"/*.deb; do dpkg-deb -f "$deb" Package Version | paste -sd' '; done >"$ROOT/debs.txt"
}

build_pause() {
  echo "build-runtime: building the static pause binary"
  run "gcc pause" "$ROOT/log/pause.log" gcc -Os -static -s -o "$BIN/pause" "$HERE/../tools/pause/pause.c"
}

start=$(date +%s)
have_debs || fetch_debs
[[ -x "$BIN/pause" ]] || build_pause
have_go || build_containerd
have_all || die "build finished but binaries are missing in $ROOT"
echo "build-runtime: done in $(( $(date +%s) - start ))s; runtime in $ROOT"
