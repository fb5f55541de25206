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

die() { echo "build-kube-peers: $*" >&2; exit 1; }
command -v go >/dev/null || die "Go is not installed; Go >= $GO_MIN is needed (k8s.io/kubernetes $KUBE_VERSION asks for it)."
export GOTOOLCHAIN=local GOFLAGS=-buildvcs=false CGO_ENABLED=0
mkdir -p "$BIN" "$ROOT/log"
exec 9>"$ROOT/.build.lock"
flock 9
if have_all; then echo "peer binaries cached in $BIN"; exit 0; fi

run() {
  local label=$1 log=$2; shift 2
  if ! "$@" >"$log" 2>&1; then
    echo "build-kube-peers: $label failed ($*); the lines that matter from $log:" >&2
    grep -E 'error|cannot|missing|not found|undefined|go: ' "$log" | head -n 20 >&2 || true
    echo "--- last lines ---" >&2; tail -n 15 "$log" >&2
    exit 1
  fi
}

minor=${KUBE_VERSION#v1.}; minor=${minor%%.*}
patch=${KUBE_VERSION##*.}
staging_tag="v0.${minor}.${patch}"
start=$(date +%s)

mod="$ROOT/src"; mkdir -p "$mod/noopplugin"
gomod=$(cd "$mod" && go mod download -json "k8s.io/kubernetes@$KUBE_VERSION" | sed -n 's/.*"GoMod": "\(.*\)".*/\1/p')
[[ -f "$gomod" ]] || die "could not download k8s.io/kubernetes@$KUBE_VERSION"
{
  echo "module accelpeersbuild"; echo; echo "go $GO_MIN"; echo
  echo "require k8s.io/kubernetes $KUBE_VERSION"; echo
  sed -n 's#^[[:space:]]*\(k8s.io/[a-z0-9-]*\) => ./staging/.*#replace \1 => \1 '"$staging_tag"'#p' "$gomod"
} >"$mod/go.mod"
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
