#!/usr/bin/env bash
# Build the images of the rig's containerd nodes and the project image, with no registry:
#   example.local/pause:3.10        the static pause binary (scripts/build-runtime.sh)
#   example.local/busybox:1.35      busybox-static from Debian, for test workloads; also named as every busybox
#                                   reference in examples/ (public.ecr.aws/docker/library/busybox:latest), so the
#                                   shipped examples run on the rig as written
#   registry.k8s.io/kube-scheduler:<version>  the cached kube-scheduler binary (scripts/build-kube.sh), named as the
#                                   neuron chart's default scheduler image, for my-scheduler (scheduler.enabled)
#   example.local/debian-python:12  Debian bookworm + python3.11 (mmdebstrap), the project image's local base
#   <chart image>:<appVersion>      the project image, built by buildah from the Dockerfile FROM that base
# Each is an OCI archive (`ctr images import` and `buildah pull oci-archive:` take them) in the image cache, with a
# listing of what is inside; the project image and its listing are also copied to dist/image/.
#
# Usage: scripts/build-images.sh [--print-dir]
#        scripts/build-images.sh --accelerator DIR [--accelerator DIR...] --name IMAGE
#            the project image with the accelerator distributions DIR... in its build context's accelerators/ (the
#            Dockerfile installs each), named IMAGE; cached apart ($CACHE/app+<IMAGE>-current), not copied to dist/
# Env:   DEBIAN_SUITE (bookworm)  DEBIAN_MIRROR (http://deb.debian.org/debian)  PYTHON (the venv's python)
#        ACCEL_IMAGE_CACHE (default: ${XDG_CACHE_HOME:-~/.cache}/aws-accel-agents/images)
# The base is cached by suite and package set; the project image by the hash of what the build reads.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(cd "$HERE/.." && pwd)"
SUITE=${DEBIAN_SUITE:-bookworm}
MIRROR=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
CACHE=${ACCEL_IMAGE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/aws-accel-agents/images}
PYTHON=${PYTHON:-$REPO/.venv/bin/python}
# What the daemons need from Debian: python3.11 and its standard library, libudev (pyudev), libstdc++ (grpcio).
BASE_PACKAGES=python3-minimal,libpython3.11-stdlib,libudev1,libstdc++6
BASE_NAME=example.local/debian-python:12
APP_REPO=$(sed -n 's/^  repository: *//p' "$REPO/charts/neuron-helm-chart/values.yaml" | head -n1)
APP_VERSION=$(sed -n 's/^appVersion: *"\{0,1\}\([^"]*\)"\{0,1\}$/\1/p' "$REPO/charts/neuron-helm-chart/Chart.yaml")
APP_NAME="$APP_REPO:$APP_VERSION"

if [[ "${1:-}" == "--print-dir" ]]; then echo "$CACHE"; exit 0; fi
die() { echo "build-images: $*" >&2; exit 1; }
EXTRA=()   # accelerator distributions (directories) for a variant image
VARIANT=""
while [[ $# -gt 0 ]]; do
  case "$1" in
    --accelerator) [[ -f "${2:-}/pyproject.toml" ]] || die "--accelerator ${2:-}: no pyproject.toml there"
                   EXTRA+=("$(cd "$2" && pwd)"); shift 2 ;;
    --name) [[ -n "${2:-}" ]] || die "--name needs an image name"; APP_NAME=$2; VARIANT="+${2//[\/:]/_}"; shift 2 ;;
    *) die "unknown argument $1 (see the usage at the top)" ;;
  esac
done
[[ ${#EXTRA[@]} -eq 0 || -n "$VARIANT" ]] || die "--accelerator needs --name: the image is not the charts' default"
[[ -x "$PYTHON" ]] || die "$PYTHON not found; run make setup first"

RUNTIME=$("$HERE/build-runtime.sh" --print-dir)
"$HERE/build-runtime.sh" >/dev/null
DEBROOT="$RUNTIME/debroot"
mkdir -p "$CACHE/log"
exec 9>"$CACHE/.build.lock"
flock 9
start=$(date +%s)

oci() { "$PYTHON" -m accel_rig.ociimage "$@" >/dev/null; }
[[ -f "$CACHE/pause.oci.tar" ]] || oci pause "$RUNTIME/bin/pause" --name example.local/pause:3.10 --out "$CACHE/pause.oci.tar"
# The busybox the examples name: every distinct busybox image reference under examples/.
mapfile -t BUSYBOX_ALIASES < <(grep -rhoE 'image: *[^ #"]*busybox[^ #"]*' "$REPO/examples" | sed 's/^image: *//' | sort -u)
has_names() { local index; index=$(tar -xOf "$1" index.json 2>/dev/null) || return 1; shift
  for n in "$@"; do [[ "$index" == *"\"$n\""* ]] || return 1; done; }
has_names "$CACHE/busybox.oci.tar" example.local/busybox:1.35 "${BUSYBOX_ALIASES[@]}" \
  || oci busybox "$DEBROOT/bin/busybox" --name example.local/busybox:1.35 \
       "${BUSYBOX_ALIASES[@]/#/--alias=}" --out "$CACHE/busybox.oci.tar"

# ---- kube-scheduler for the neuron chart's my-scheduler: the chart's default reference (scheduler.image.repository,
# tag = the cluster's version, which is the binary's own). Rebuilt when the binary is newer than the archive; skipped,
# with a note, while the kube binaries are not built yet (make kube).
KUBE_BIN=${ACCEL_KUBE_BIN:-$("$HERE/build-kube.sh" --print-dir)}
if [[ -x "$KUBE_BIN/kube-scheduler" ]]; then
  sched_repo=$("$PYTHON" -c 'import sys, yaml; print(yaml.safe_load(open(sys.argv[1]))["scheduler"]["image"]["repository"])' \
    "$REPO/charts/neuron-helm-chart/values.yaml")
  sched_version=$("$KUBE_BIN/kube-scheduler" --version | awk '{print $2}')
  SCHED_NAME="$sched_repo:$sched_version"
  if [[ "$KUBE_BIN/kube-scheduler" -nt "$CACHE/kube-scheduler.oci.tar" ]] || ! has_names "$CACHE/kube-scheduler.oci.tar" "$SCHED_NAME"; then
    oci static "$KUBE_BIN/kube-scheduler" --at /usr/local/bin/kube-scheduler --name "$SCHED_NAME" \
      --out "$CACHE/kube-scheduler.oci.tar"
  fi
else
  echo "build-images: no kube-scheduler in $KUBE_BIN yet (make kube): the my-scheduler image is left out"
fi

# ---- the Debian Python base: mmdebstrap's essential set (merged /usr without the usrmerge package, which would pull
# in perl) plus BASE_PACKAGES; docs, man pages and locales left out (copyrights kept); perl-base and debconf purged,
# since nothing in the image runs perl. The package listing is written from the image's own dpkg database.
# BASE_REVISION: raise it when the mmdebstrap options below change (the cache key of the base).
BASE_REVISION=1
base_key=$(printf '%s %s %s' "$SUITE" "$BASE_PACKAGES" "$BASE_REVISION" | sha256sum | cut -c1-16)
BASE_DIR="$CACHE/base-$SUITE-$base_key"
if [[ ! -f "$BASE_DIR/base.oci.tar" ]]; then
  echo "build-images: building $BASE_NAME (Debian $SUITE + $BASE_PACKAGES; a few minutes the first time)"
  rm -rf "$BASE_DIR"; mkdir -p "$BASE_DIR"
  t0=$(date +%s)
  if ! PERL5LIB="$DEBROOT/usr/share/perl5" PATH="$DEBROOT/usr/bin:$PATH" perl "$DEBROOT/usr/bin/mmdebstrap" \
      --mode=root --variant=essential --include="$BASE_PACKAGES" \
      --hook-directory="$DEBROOT/usr/share/mmdebstrap/hooks/merged-usr" \
      --dpkgopt='path-exclude=/usr/share/doc/*' --dpkgopt='path-include=/usr/share/doc/*/copyright' \
      --dpkgopt='path-exclude=/usr/share/man/*' --dpkgopt='path-exclude=/usr/share/info/*' \
      --dpkgopt='path-exclude=/usr/share/locale/*' \
      --customize-hook='chroot "$1" dpkg --purge --force-remove-essential --force-depends debconf perl-base' \
      --customize-hook="chroot \"\$1\" dpkg-query -W -f '\${Package} \${Version}\n' > '$BASE_DIR/debian-packages.txt'" \
      --customize-hook='rm -rf "$1"/var/cache/debconf "$1"/var/lib/apt/lists/* "$1"/var/log/*' \
      "$SUITE" "$BASE_DIR/rootfs.tar" "$MIRROR" >"$CACHE/log/mmdebstrap.log" 2>&1; then
    tail -n 20 "$CACHE/log/mmdebstrap.log" >&2; die "mmdebstrap failed (log $CACHE/log/mmdebstrap.log)"
  fi
  oci rootfs "$BASE_DIR/rootfs.tar" --name "$BASE_NAME" --out "$BASE_DIR/base.oci.tar" \
    --label "org.opencontainers.image.description=Debian $SUITE with python3.11 (mmdebstrap)"
  rm -f "$BASE_DIR/rootfs.tar"
  echo "build-images: base built in $(( $(date +%s) - t0 ))s"
fi

# ---- the project image: buildah, with its own storage and config under the cache, runc from the deb root, no
# network in RUN steps. The wheels come from a wheelhouse made here by pip (the build's RUN steps have no network).
BUILDAH_DIR="$CACHE/buildah"
mkdir -p "$BUILDAH_DIR/root" "$BUILDAH_DIR/runroot"
cat >"$BUILDAH_DIR/containers.conf" <<EOF
[containers]
netns = "none"
[engine]
cgroup_manager = "cgroupfs"
runtime = "runc"
[engine.runtimes]
runc = ["$DEBROOT/usr/bin/runc"]
EOF
printf '{"default": [{"type": "insecureAcceptAnything"}]}\n' >"$BUILDAH_DIR/policy.json"
printf 'unqualified-search-registries = []\n' >"$BUILDAH_DIR/registries.conf"
printf '[storage]\ndriver = "overlay"\nrunroot = "%s"\ngraphroot = "%s"\n' \
  "$BUILDAH_DIR/runroot" "$BUILDAH_DIR/root" >"$BUILDAH_DIR/storage.conf"
buildah() {
  CONTAINERS_CONF="$BUILDAH_DIR/containers.conf" CONTAINERS_REGISTRIES_CONF="$BUILDAH_DIR/registries.conf" \
  CONTAINERS_STORAGE_CONF="$BUILDAH_DIR/storage.conf" LD_LIBRARY_PATH="$DEBROOT/usr/lib/x86_64-linux-gnu" \
  PATH="$DEBROOT/usr/bin:$DEBROOT/usr/sbin:$PATH" "$DEBROOT/usr/bin/buildah" "$@"
}

# The files of an accelerator distribution (NUL-separated, relative): its source, not caches or build outputs.
extra_files() { (cd "$1" && find . \( -name '.?*' -o -name __pycache__ -o -name '*.egg-info' -o -name build -o -name dist \
  -o -name charts \) \
  -prune -o -type f -print0 | sort -z); }
app_key=$( (cd "$REPO" && git ls-files -z -- Dockerfile .dockerignore pyproject.toml README.md accel_core efa_plugin \
    neuron_dra accelerators | xargs -0 sha256sum
    for d in "${EXTRA[@]}"; do extra_files "$d" | (cd "$d" && xargs -0 sha256sum); done
    echo "$base_key $APP_NAME") | sha256sum | cut -c1-16)
APP_DIR="$CACHE/app$VARIANT-$app_key"
if [[ ! -f "$APP_DIR/image.oci.tar" ]]; then
  echo "build-images: building $APP_NAME from the Dockerfile (buildah, FROM $BASE_NAME)"
  rm -rf "$APP_DIR"; mkdir -p "$APP_DIR"
  t0=$(date +%s)
  # The context: the files the Dockerfile copies (no caches) and a wheelhouse of every wheel the install needs.
  ctx="$APP_DIR/context"; mkdir -p "$ctx/wheelhouse"
  (cd "$REPO" && tar -cf - --exclude=__pycache__ Dockerfile .dockerignore pyproject.toml README.md accel_core efa_plugin \
      neuron_dra accelerators wheelhouse) | tar -xf - -C "$ctx"
  locals=("$ctx")  # what pip builds here rather than takes from the wheelhouse: the project and the accelerators
  for d in "${EXTRA[@]}"; do
    mkdir -p "$ctx/accelerators/${d##*/}"
    extra_files "$d" | tar -C "$d" -cf - --null -T - | tar -xf - -C "$ctx/accelerators/${d##*/}"
    locals+=("$ctx/accelerators/${d##*/}")
  done
  "$PYTHON" -m pip download --quiet --dest "$ctx/wheelhouse" pip 'setuptools>=68' wheel >"$CACHE/log/wheelhouse.log" 2>&1 \
    && "$PYTHON" -m pip wheel --quiet --wheel-dir "$ctx/wheelhouse" "${locals[@]}" >>"$CACHE/log/wheelhouse.log" 2>&1 \
    || { tail -n 20 "$CACHE/log/wheelhouse.log" >&2; die "pip could not fill the wheelhouse"; }
  for d in "${locals[@]}"; do  # their own wheels go: the build makes them from the copied source
    name=$("$PYTHON" -c 'import sys, tomllib; print(tomllib.load(open(sys.argv[1], "rb"))["project"]["name"])' \
      "$d/pyproject.toml")
    rm -f "$ctx/wheelhouse/$(echo "$name" | tr '.-' '__')"-*.whl
  done
  buildah pull --signature-policy "$BUILDAH_DIR/policy.json" "oci-archive:$BASE_DIR/base.oci.tar" \
    >"$CACHE/log/buildah-pull.log" 2>&1 || { tail "$CACHE/log/buildah-pull.log" >&2; die "buildah pull failed"; }
  if ! buildah bud --pull=never --network=none --isolation=oci --layers=false \
      --signature-policy "$BUILDAH_DIR/policy.json" --build-arg "PYTHON_IMAGE=$BASE_NAME" \
      --build-arg PIP_NO_INDEX=1 -t "$APP_NAME" "$ctx" >"$CACHE/log/buildah-bud.log" 2>&1; then
    tail -n 30 "$CACHE/log/buildah-bud.log" >&2; die "buildah bud failed (log $CACHE/log/buildah-bud.log)"
  fi
  # The listing: Debian packages from the image's dpkg database, Python distributions from its venv.
  ctr=$(buildah from --pull=never "$APP_NAME")
  mnt=$(buildah mount "$ctr")
  {
    echo "# $APP_NAME: Debian packages (dpkg database of the image)"
    dpkg-query --admindir="$mnt/var/lib/dpkg" -W -f '${Package} ${Version}\n' 2>/dev/null | sed 's/^/deb /'
    echo "# Python distributions (/opt/venv)"
    for d in "$mnt"/opt/venv/lib/python3*/site-packages/*.dist-info; do
      sed -n 's/^Name: //p;s/^Version: //p' "$d/METADATA" | head -n2 | paste -sd' ' | sed 's/^/py /'
    done | sort
    echo "# Files the daemons do not use, which must be absent (an empty list below)"
    for f in usr/bin/perl usr/bin/pip3 usr/bin/gcc opt/venv/bin/pip; do [[ -e "$mnt/$f" ]] && echo "present /$f"; done
    echo "# Uncompressed size (bytes)"
    du -sb "$mnt" | cut -f1
  } >"$APP_DIR/packages.txt"
  buildah umount "$ctr" >/dev/null; buildah rm "$ctr" >/dev/null
  buildah push --signature-policy "$BUILDAH_DIR/policy.json" "$APP_NAME" "oci-archive:$APP_DIR/image.oci.tar:$APP_NAME" \
    >"$CACHE/log/buildah-push.log" 2>&1 || { tail "$CACHE/log/buildah-push.log" >&2; die "buildah push failed"; }
  buildah rmi --all >/dev/null 2>&1 || true
  rm -rf "$ctx"
  echo "build-images: $APP_NAME built in $(( $(date +%s) - t0 ))s"
fi
ln -sfn "$APP_DIR" "$CACHE/app$VARIANT-current"
# Older builds of the same image are not kept (each is an archive of ~55 MB).
for old in "$CACHE/app$VARIANT"-*; do
  [[ "$old" == "$APP_DIR" || "$old" == "$CACHE/app$VARIANT-current" ]] || rm -rf "$old"
done
if [[ -n "$VARIANT" ]]; then
  echo "build-images: done in $(( $(date +%s) - start ))s: $APP_NAME ($CACHE/app$VARIANT-current/image.oci.tar)"
  exit 0
fi
ln -sfn "$BASE_DIR" "$CACHE/base-current"
mkdir -p "$REPO/dist/image"
cp "$APP_DIR/image.oci.tar" "$REPO/dist/image/aws-accel-agents-$APP_VERSION.oci.tar"
cp "$APP_DIR/packages.txt" "$REPO/dist/image/aws-accel-agents-$APP_VERSION.packages.txt"
echo "build-images: done in $(( $(date +%s) - start ))s: $APP_NAME ($(du -h "$APP_DIR/image.oci.tar" | cut -f1) compressed);"\
  "dist/image/aws-accel-agents-$APP_VERSION.oci.tar and .packages.txt"
