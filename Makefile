# Two entry points that work on a fresh machine:
#   make demo   - set up, then run every daemon on a fake p5/trn2 node against the kubelet stand-in
#   make test   - set up, build the real Kubernetes parts, containerd and the image (cached), lint, type-check and
#                 run all tests
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin

.PHONY: setup demo test lint typecheck unit protos kube runtime image kube-peers cdicheck bench bench-compare clean

setup: $(VENV)/.installed
	scripts/chart-deps.sh  # the charts' local dependencies (charts/<chart>/charts/), copied fresh

$(VENV)/.installed: pyproject.toml rig/pyproject.toml tests/sample_accelerator/pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev]'
	$(BIN)/pip install --quiet -e rig  # the dev rig, a distribution of its own (rig/pyproject.toml)
	$(BIN)/pip install --quiet --no-deps -e tests/sample_accelerator  # the tests' third accelerator
	touch $@

kube:
	scripts/build-kube.sh

# containerd 2.x + runc (and buildah, mmdebstrap, busybox) for the rig's containerd nodes, cached; nothing installed
runtime:
	scripts/build-runtime.sh

# The project image from the Dockerfile, with no registry: OCI archive + package listing in dist/image/ (cached)
image: setup runtime
	scripts/build-images.sh

# The tests' CDI oracle (tools/cdicheck: upstream's pkg/cdi, as containerd loads specs), cached by source hash
cdicheck:
	scripts/build-cdicheck.sh

# The Go peers of the side-by-side benchmark (own cache; `make test` never builds them)
kube-peers:
	scripts/build-kube-peers.sh

demo: setup
	$(BIN)/accel-demo

lint: setup
	$(BIN)/ruff check .

typecheck: setup
	$(BIN)/mypy
	MYPYPATH=tests/sample_accelerator $(BIN)/mypy -p accel_sample  # the tests' third accelerator, as its own package

protos: setup
	$(BIN)/python scripts/gen_protos.py

# Unit and component tests run on three workers (pytest-xdist) that steal work from each other: many tests wait on
# daemons they started, so a third worker fills the waits of two cores, and work stealing keeps the few long tests
# from ending the run on one worker (2 cores: -n 2 60-62 s, -n 3 --dist worksteal 42-51 s). e2e tests start
# control planes and kubelets and run one at a time; those that only run a tool built from Go (marker gotools: helm
# template, cdicheck) run on the workers. The dev rig's own tests are in tests/rig/{unit,component,e2e}.
XDIST ?= -n 3 --dist worksteal
UNIT_TESTS := tests/unit tests/component tests/rig/unit tests/rig/component
E2E_TESTS  := tests/e2e tests/rig/e2e

unit: setup
	$(BIN)/pytest $(XDIST) $(UNIT_TESTS)

test: setup kube cdicheck image lint typecheck
	$(BIN)/pytest $(XDIST) $(UNIT_TESTS)
	$(BIN)/pytest $(XDIST) -m gotools $(E2E_TESTS)
	$(BIN)/pytest -m "not gotools" $(E2E_TESTS)

bench: setup kube
	for b in bench/bench_*.py; do echo "== $$b"; $(BIN)/python $$b || exit 1; done

# Ours against the upstream Go sample device plugin and DRA test driver, and the no-op Go/Python floors, one run
bench-compare: setup kube kube-peers
	$(BIN)/python bench/bench_compare.py

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
