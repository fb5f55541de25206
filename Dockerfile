# syntax=docker/dockerfile:1
# One image for every daemon of aws-accel-agents: efa-device-plugin, efa-dra-driver, neuron-device-plugin,
# neuron-dra-driver, neuron-scheduler-extender (and the read-only inspection commands). The Helm charts pick the
# daemon with `command:`. The dev-only code (accel_core/fakehost and the accelerators' fake-host parts,
# rig/accel_rig) is left out by .dockerignore: no daemon needs it. Accelerators of other distributions: each
# directory under accelerators/ of the build context that holds a pyproject.toml is installed beside the project
# (accelerators/README.md); nothing here names them.
#
#   make image                                   # no registry: buildah, FROM a Debian bookworm + python3.11 base made
#                                                # by mmdebstrap (scripts/build-images.sh); OCI archive in dist/image/
#   docker build -t ghcr.io/aws-accel-agents/aws-accel-agents:0.1.0 .    # where a registry is reachable
#   docker build --build-arg PYTHON_IMAGE=python:3.11.13-slim-bookworm@sha256:<digest> ...   # pin by digest too
#
# Stage 1 installs the project and its dependencies into a virtual environment, /opt/venv, from wheels only (the
# wheelhouse of the context when it is filled, else the index); stage 2 copies that environment onto a clean base
# and keeps nothing else: no pip, no setuptools, no compiler, no source tree, no dev console scripts.

ARG PYTHON_IMAGE=python:3.11.13-slim-bookworm

FROM ${PYTHON_IMAGE} AS build
# PIP_NO_INDEX=1 (a build argument, so an environment variable of the RUN steps) makes pip use the wheelhouse only.
ARG PIP_NO_INDEX
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_CACHE_DIR=1 PIP_ONLY_BINARY=:all: PIP_FIND_LINKS=/wheelhouse
WORKDIR /src
# Only what the install needs (see .dockerignore): the build does not depend on tests, charts or docs.
COPY wheelhouse/ /wheelhouse/
COPY pyproject.toml README.md ./
COPY accel_core ./accel_core
COPY efa_plugin ./efa_plugin
COPY neuron_dra ./neuron_dra
COPY accelerators/ ./accelerators/
# pip: the venv's own where the base has ensurepip (python:*-slim), else the pip wheel of the wheelhouse run as a
# zip (a Debian python3 has neither ensurepip nor pip, by design). The project itself is built from this source
# (PIP_ONLY_BINARY covers its dependencies; the project is a local directory), and so is every accelerator
# distribution under accelerators/. Then pip, setuptools and the fake-sysfs console script go: its module is not in
# the image.
# hadolint ignore=SC2086
RUN if python3 -c "import ensurepip" 2>/dev/null; then \
        python3 -m venv /opt/venv && pip="/opt/venv/bin/python -m pip"; \
    else \
        python3 -m venv --without-pip /opt/venv && pip="/opt/venv/bin/python $(echo /wheelhouse/pip-*.whl)/pip"; \
    fi \
    && extra="" && for d in accelerators/*/; do if [ -f "$d/pyproject.toml" ]; then extra="$extra ./$d"; fi; done \
    && $pip install --no-compile . $extra \
    && /opt/venv/bin/python -m compileall -q -j 0 /opt/venv/lib \
    && rm -rf /opt/venv/bin/pip* /opt/venv/lib/python3*/site-packages/pip /opt/venv/lib/python3*/site-packages/pip-* \
        /opt/venv/lib/python3*/site-packages/setuptools* /opt/venv/lib/python3*/site-packages/_distutils_hack \
        /opt/venv/lib/python3*/site-packages/distutils-precedence.pth /opt/venv/lib/python3*/site-packages/pkg_resources \
        /opt/venv/bin/fake-sysfs

FROM ${PYTHON_IMAGE}
COPY --from=build /opt/venv /opt/venv
# glibc malloc: per-thread caches off and two arenas. Chunks parked in a thread's cache count as in use, and each
# thread that allocates can get an arena of its own; both grew a device plugin's RSS by ~0.3 MB over its first
# thousand kubelet restarts. With these its heap and RSS stay flat, and its kubelet round trips and the DRA prepare
# cost the same (docs/benchmarks.md, "Kubelet restarts"). A pod's own GLIBC_TUNABLES replaces this one.
ENV PATH=/opt/venv/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    GLIBC_TUNABLES=glibc.malloc.tcache_count=0:glibc.malloc.arena_max=2
# The build fails if libudev (pyudev's udev monitor) or the console script of a daemon any installed accelerator
# declares (accel_core.registry) is missing.
RUN python3 -c "import pyudev; pyudev.Context()" \
    && daemons=$(python3 -c "from accel_core.registry import accelerators; \
print(*(d.script for a in accelerators() for d in a.daemons))") \
    && test -n "$daemons" \
    && for d in $daemons; do echo "$d --help"; "$d" --help >/dev/null || exit 1; done
LABEL org.opencontainers.image.title="aws-accel-agents" \
      org.opencontainers.image.description="Kubernetes node agents for AWS accelerators: EFA and Neuron device plugins and DRA drivers" \
      org.opencontainers.image.licenses="Apache-2.0"
# No USER: the daemons need uid 0 because the kubelet's socket directories belong to root. The charts run them with
# every capability dropped, no privilege escalation and a read-only root filesystem.
# No ENTRYPOINT either: the daemon is the command, e.g. `docker run IMAGE efa-device-plugin --help`.
