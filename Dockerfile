# syntax=docker/dockerfile:1
# One image for every daemon of aws-accel-agents: efa-device-plugin, efa-dra-driver, neuron-device-plugin,
# neuron-dra-driver (and the read-only inspection commands). The Helm charts pick the daemon with `command:`.
# The dev-only code (accel_core/fakehost, accel_core/devtools) is left out by .dockerignore: no daemon needs it.
#
#   docker build -t aws-accel-agents:0.1.0 .
#   docker build --build-arg PYTHON_IMAGE=python:3.11.13-slim-bookworm@sha256:<digest> ...   # pin by digest too
#
# Stage 1 builds the project wheel and collects the wheels of its dependencies; stage 2 installs exactly those wheels
# (no index, no compiler, no source tree) and then removes pip itself, and the dev tools' console scripts (their
# modules are not in the image).

ARG PYTHON_IMAGE=python:3.11.13-slim-bookworm

FROM ${PYTHON_IMAGE} AS build
WORKDIR /src
# Only what the wheel needs (see .dockerignore): the build does not depend on tests, charts or docs.
COPY pyproject.toml README.md ./
COPY accel_core ./accel_core
COPY efa_plugin ./efa_plugin
COPY neuron_dra ./neuron_dra
# The project wheel (PEP 517 build in an isolated environment) plus a wheel for every runtime dependency.
RUN pip wheel --no-cache-dir --prefer-binary --wheel-dir /wheels .

FROM ${PYTHON_IMAGE}
ENV PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1
# Install from the wheels of stage 1 only (mounted for this step, so they do not stay in a layer); then drop pip,
# setuptools and wheel, which the daemons never use. The last line fails the build if a console script or libudev
# (pyudev's udev monitor) is missing.
RUN --mount=type=bind,from=build,source=/wheels,target=/wheels \
    pip install --no-cache-dir --no-index --find-links=/wheels /wheels/aws_accel_agents-*.whl \
    && pip uninstall --yes --quiet pip setuptools wheel \
    && python -c "import pyudev; pyudev.Context()" \
    && rm -f /usr/local/bin/fake-sysfs /usr/local/bin/accel-demo /usr/local/bin/accel-cluster \
    && efa-device-plugin --help >/dev/null \
    && efa-dra-driver --help >/dev/null \
    && neuron-device-plugin --help >/dev/null \
    && neuron-dra-driver --help >/dev/null
LABEL org.opencontainers.image.title="aws-accel-agents" \
      org.opencontainers.image.description="Kubernetes node agents for AWS accelerators: EFA and Neuron device plugins and DRA drivers" \
      org.opencontainers.image.licenses="Apache-2.0"
# No USER: the daemons need uid 0 because the kubelet's socket directories belong to root. The charts run them with
# every capability dropped, no privilege escalation and a read-only root filesystem.
# No ENTRYPOINT either: the daemon is the command, e.g. `docker run IMAGE efa-device-plugin --help`.
