# Shared by scripts/build-kube.sh and scripts/build-kube-peers.sh (sourced, not run). The caller sets NAME (its
# message prefix), GO_MIN, KUBE_VERSION, ROOT (its cache directory for this version) and BIN.

die() { echo "$NAME: $*" >&2; exit 1; }

# go_build_env: check Go, set the build environment, create the cache and take its lock (one build at a time per
# cache: parallel test sessions may call a build script together; the caller re-checks its cache after this).
go_build_env() {
  command -v go >/dev/null || die "Go is not installed; Go >= $GO_MIN is needed (k8s.io/kubernetes $KUBE_VERSION asks for it)."
  local gov; gov=$(go env GOVERSION | sed 's/^go//')
  [[ "$(printf '%s\n%s\n' "$GO_MIN" "$gov" | sort -V | head -n1)" == "$GO_MIN" ]] \
    || die "Go $gov is too old; Go >= $GO_MIN is needed for k8s.io/kubernetes $KUBE_VERSION."
  export GOTOOLCHAIN=local GOFLAGS=-buildvcs=false CGO_ENABLED=0
  mkdir -p "$BIN" "$ROOT/log"
  exec 9>"$ROOT/.build.lock"
  flock 9
}

# run LABEL LOG cmd...: run quietly; on failure show what matters, not pages.
run() {
  local label=$1 log=$2; shift 2
  if ! "$@" >"$log" 2>&1; then
    echo "$NAME: $label failed ($*); the lines that matter from $log:" >&2
    grep -E 'error|cannot|missing|not found|undefined|go: ' "$log" | head -n 20 >&2 || true
    echo "--- last lines ---" >&2; tail -n 15 "$log" >&2
    exit 1
  fi
}

# The staging modules' published tag for KUBE_VERSION (v1.37.2 -> v0.37.2); minor is used for version stamps.
minor=${KUBE_VERSION#v1.}; minor=${minor%%.*}
staging_tag="v0.${minor}.${KUBE_VERSION##*.}"

# kube_gomod MODULE DIR: write DIR/go.mod for module MODULE requiring k8s.io/kubernetes KUBE_VERSION. Upstream
# requires its staging modules at v0.0.0 and replaces them by local paths; point each at its published tag instead.
kube_gomod() {
  local module=$1 dir=$2 gomod
  gomod=$(cd "$dir" && go mod download -json "k8s.io/kubernetes@$KUBE_VERSION" | sed -n 's/.*"GoMod": "\(.*\)".*/\1/p')
  [[ -f "$gomod" ]] || die "could not download k8s.io/kubernetes@$KUBE_VERSION"
  {
    echo "module $module"; echo; echo "go $GO_MIN"; echo
    echo "require k8s.io/kubernetes $KUBE_VERSION"; echo
    sed -n 's#^[[:space:]]*\(k8s.io/[a-z0-9-]*\) => ./staging/.*#replace \1 => \1 '"$staging_tag"'#p' "$gomod"
  } >"$dir/go.mod"
}
