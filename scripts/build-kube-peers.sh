#!/usr/bin/env bash
# Build and cache the Go peers that `make bench-compare` measures our daemons against, from the Go module proxy:
#   sample-device-plugin  k8s.io/kubernetes/test/images/sample-device-plugin (the upstream sample device plugin)
#   dra-test-driver       k8s.io/kubernetes/test/e2e/dra/test-driver (the DRA driver upstream e2e tests run)
#   noopplugin            tools/noopplugin: a Go device plugin that does nothing beyond the protocol (the Go floor)
# Own cache (never the one of scripts/build-kube.sh, whose key stays as it is); the k8s.io/kubernetes module is
# resolved the same way as there (staging modules pointed at their published tags), so the download it made is reused.
#
# Usage: scripts/build-kube-peers.sh [--print-dir]
# Env:   KUBE_VERSION (v1.37.2)  ACCEL_PEERS_CACHE (default: ${XDG_CACHE_HOME:-~/.cache}/aws-accel-agents/kube-peers)
set -euo pipefail

KUBE_VERSION=${KUBE_VERSION:-v1.37.2}
GO_MIN=1.26
CACHE=${ACCEL_PEERS_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/aws-accel-agents/kube-peers}
ROOT="$CACHE/$KUBE_VERSION"
BIN="$ROOT/bin"
WANTED=(sample-device-plugin dra-test-driver noopplugin)
NOOP_SRC="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)/tools/noopplugin"

if [[ "${1:-}" == "--print-dir" ]]; then echo "$BIN"; exit 0; fi

noop_sum() { (cd "$NOOP_SRC" && cat ./*.go | sha256sum | cut -c1-16); }
have_all() {
  for b in "${WANTED[@]}"; do [[ -x "$BIN/$b" ]] || return 1; done
  [[ "$(cat "$BIN/noopplugin.sum" 2>/dev/null)" == "$(noop_sum)" ]]
}
if have_all; then echo "peer binaries cached in $BIN"; exit 0; fi

NAME=build-kube-peers
# shellcheck source=scripts/gobuild-lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/gobuild-lib.sh"
go_build_env
if have_all; then echo "peer binaries cached in $BIN"; exit 0; fi

start=$(date +%s)

mod="$ROOT/src"; mkdir -p "$mod/noopplugin"
kube_gomod accelpeersbuild "$mod"
cp "$NOOP_SRC"/*.go "$mod/noopplugin/"
pkgs=(k8s.io/kubernetes/test/images/sample-device-plugin k8s.io/kubernetes/test/e2e/dra/test-driver)
echo "build-kube-peers: resolving modules for the sample device plugin and the DRA test driver"
(cd "$mod" && run "go get" "$ROOT/log/get.log" go get "${pkgs[@]}" k8s.io/kubelet google.golang.org/grpc)
echo "build-kube-peers: building sample-device-plugin, dra-test-driver, noopplugin"
(cd "$mod" && run "go build sample-device-plugin" "$ROOT/log/build.log" \
   go build -trimpath -ldflags "-s -w" -o "$BIN/sample-device-plugin" k8s.io/kubernetes/test/images/sample-device-plugin \
 && run "go build dra-test-driver" "$ROOT/log/build-dra.log" \
   go build -trimpath -ldflags "-s -w" -o "$BIN/dra-test-driver" k8s.io/kubernetes/test/e2e/dra/test-driver \
 && run "go build noopplugin" "$ROOT/log/build-noop.log" go build -trimpath -ldflags "-s -w" -o "$BIN/noopplugin" ./noopplugin)
noop_sum >"$BIN/noopplugin.sum"
have_all || die "build finished but binaries are missing in $BIN"
echo "build-kube-peers: done in $(( $(date +%s) - start ))s; binaries in $BIN"
