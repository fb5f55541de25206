#!/usr/bin/env bash
# Build and cache the real Kubernetes parts the tests and the demo run: kube-apiserver, kube-scheduler,
# kube-controller-manager, kubectl and kubelet (k8s.io/kubernetes), an etcd server (go.etcd.io/etcd/server/v3)
# and helm (helm.sh/helm/v3), all from the Go module proxy; plus the project's own fake CRI runtime
# (tools/fakecri), which the kubelet talks to instead of containerd.
#
# Usage: scripts/build-kube.sh [--print-dir]
# Env:   KUBE_VERSION (v1.37.2)  ETCD_VERSION (v3.7.0)  HELM_VERSION (v3.22.0)
#        ACCEL_KUBE_CACHE (default: ${XDG_CACHE_HOME:-~/.cache}/aws-accel-agents/kube)
# Binaries land in $ACCEL_KUBE_CACHE/<kube>-etcd<etcd>-helm<helm>/bin; a second run is a no-op (fakecri is
# rebuilt when its sources change).
set -euo pipefail

KUBE_VERSION=${KUBE_VERSION:-v1.37.2}
ETCD_VERSION=${ETCD_VERSION:-v3.7.0}
HELM_VERSION=${HELM_VERSION:-v3.22.0}
GO_MIN=1.26
CACHE=${ACCEL_KUBE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/aws-accel-agents/kube}
ROOT="$CACHE/${KUBE_VERSION}-etcd${ETCD_VERSION}-helm${HELM_VERSION}"
BIN="$ROOT/bin"
WANTED=(kube-apiserver kube-scheduler kube-controller-manager kubectl kubelet etcd helm fakecri)
FAKECRI_SRC="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)/tools/fakecri"

if [[ "${1:-}" == "--print-dir" ]]; then echo "$BIN"; exit 0; fi
# --helm-only: build just helm (the chart render tests need nothing else), same cache and lock.
HELM_ONLY=0
if [[ "${1:-}" == "--helm-only" ]]; then HELM_ONLY=1; WANTED=(helm); fi

fakecri_sum() { (cd "$FAKECRI_SRC" && cat go.mod go.sum ./*.go | sha256sum | cut -c1-16); }
fakecri_fresh() { [[ -x "$BIN/fakecri" && "$(cat "$BIN/fakecri.sum" 2>/dev/null)" == "$(fakecri_sum)" ]]; }
have_all() {
  for b in "${WANTED[@]}"; do [[ -x "$BIN/$b" ]] || return 1; done
  (( HELM_ONLY )) || fakecri_fresh
}
if have_all; then echo "kube binaries cached in $BIN"; exit 0; fi

NAME=build-kube
# shellcheck source=scripts/gobuild-lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/gobuild-lib.sh"
go_build_env
if have_all; then echo "kube binaries cached in $BIN"; exit 0; fi

build_kube() {
  local mod="$ROOT/src/kube"; mkdir -p "$mod"
  kube_gomod accelkubebuild "$mod"
  local pkgs=(k8s.io/kubernetes/cmd/kube-apiserver k8s.io/kubernetes/cmd/kube-scheduler
              k8s.io/kubernetes/cmd/kube-controller-manager k8s.io/kubernetes/cmd/kubectl
              k8s.io/kubernetes/cmd/kubelet)
  echo "build-kube: resolving k8s.io/kubernetes $KUBE_VERSION modules"
  (cd "$mod" && run "go get k8s.io/kubernetes@$KUBE_VERSION" "$ROOT/log/kube-get.log" go get "${pkgs[@]}")
  local X=""
  for p in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    X+=" -X $p.gitVersion=$KUBE_VERSION -X $p.gitMajor=1 -X $p.gitMinor=$minor -X $p.gitTreeState=clean"
  done
  echo "build-kube: building kube-apiserver, kube-scheduler, kube-controller-manager, kubectl (slow the first time)"
  (cd "$mod" && run "go build k8s.io/kubernetes $KUBE_VERSION" "$ROOT/log/kube-build.log" \
    go build -trimpath -ldflags "-s -w$X" -o "$BIN/" "${pkgs[@]}")
}

build_etcd() {
  local mod="$ROOT/src/etcd"; mkdir -p "$mod"
  printf 'module acceletcdbuild\n\ngo %s\n' "$GO_MIN" >"$mod/go.mod"
  cat >"$mod/main.go" <<'GO'
// Command etcd starts an etcd server from the published go.etcd.io/etcd/server/v3 module.
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() { etcdmain.Main(os.Args) }
GO
  echo "build-kube: building etcd $ETCD_VERSION"
  (cd "$mod" && run "go get go.etcd.io/etcd/server/v3@$ETCD_VERSION" "$ROOT/log/etcd-get.log" \
      go get "go.etcd.io/etcd/server/v3@$ETCD_VERSION" \
    && run "go build etcd" "$ROOT/log/etcd-build.log" go build -trimpath -ldflags "-s -w" -o "$BIN/etcd" .)
}

build_helm() {
  local mod="$ROOT/src/helm"; mkdir -p "$mod"
  printf 'module accelhelmbuild\n\ngo %s\n' "$GO_MIN" >"$mod/go.mod"
  echo "build-kube: building helm $HELM_VERSION"
  (cd "$mod" && run "go get helm.sh/helm/v3@$HELM_VERSION" "$ROOT/log/helm-get.log" \
      go get "helm.sh/helm/v3/cmd/helm@$HELM_VERSION" \
    && run "go build helm" "$ROOT/log/helm-build.log" go build -trimpath \
      -ldflags "-s -w -X helm.sh/helm/v3/internal/version.version=$HELM_VERSION" -o "$BIN/helm" helm.sh/helm/v3/cmd/helm)
}

build_fakecri() {
  echo "build-kube: building fakecri from $FAKECRI_SRC"
  local sum; sum=$(fakecri_sum)
  (cd "$FAKECRI_SRC" && run "go build fakecri" "$ROOT/log/fakecri-build.log" \
    go build -mod=readonly -trimpath -ldflags "-s -w" -o "$BIN/fakecri" .)
  echo "$sum" >"$BIN/fakecri.sum"
}

start=$(date +%s)
[[ -x "$BIN/helm" ]] || build_helm
if (( HELM_ONLY )); then echo "build-kube: helm in $BIN"; exit 0; fi
[[ -x "$BIN/etcd" ]] || build_etcd
[[ -x "$BIN/kube-apiserver" && -x "$BIN/kube-scheduler" && -x "$BIN/kube-controller-manager" && -x "$BIN/kubectl" \
   && -x "$BIN/kubelet" ]] \
  || build_kube
fakecri_fresh || build_fakecri
have_all || die "build finished but binaries are missing in $BIN"
echo "build-kube: done in $(( $(date +%s) - start ))s; binaries in $BIN"
