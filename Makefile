# posttrain-operator: `make` targets are the interface. `make help` lists them.
SHELL := /bin/bash
.DEFAULT_GOAL := help

PYTHON ?= python3.11
UV_VERSION := 0.13.8
CACHE_DIR ?= $(or $(XDG_CACHE_HOME),$(HOME)/.cache)/posttrain-operator
UV := $(CACHE_DIR)/tools/uv-$(UV_VERSION)/bin/uv
VENV := .venv
PY := $(VENV)/bin/python
export UV_PROJECT_ENVIRONMENT := $(abspath $(VENV))
export UV_PYTHON := $(PYTHON)
export UV_CACHE_DIR ?= $(CACHE_DIR)/uv-cache
# `make test YES=1` (or POSTTRAIN_ASSUME_YES=1): the steps that change this machine (system packages,
# Docker's default runtime, directory permissions) go ahead without asking.
ifeq ($(YES),1)
export POSTTRAIN_ASSUME_YES := 1
endif

##@ Setup

$(UV):
	$(PYTHON) -m pip install --quiet --disable-pip-version-check --target $(CACHE_DIR)/tools/uv-$(UV_VERSION) uv==$(UV_VERSION)

TASK_PLUGINS := examples/linear-map-task tasks/gsm8k

# Two tasks are plugins in packages of their own, installed beside the project the way a lab would
# install theirs (sync removes what the lock does not name, so they are installed after). A cold sync
# downloads about 3 GB (torch, CUDA wheels): uv shows its progress.
$(VENV)/.synced: $(UV) pyproject.toml uv.lock $(addsuffix /pyproject.toml,$(TASK_PLUGINS))
	$(UV) sync --locked --all-extras
	$(UV) pip install --no-deps $(addprefix --editable ,$(TASK_PLUGINS))
	@touch $@

.PHONY: venv
venv: $(VENV)/.synced ## Create .venv with every extra and the dev group (locked; torch included, ~3 GB)

VENV_LIGHT := .venv-light
LIGHT_EXTRAS := operator gateway cli

# The operator, the gateway and the CLI with the tools group (pytest, ruff, mypy): no torch, no
# graders or trl. Enough to run and change those three; the test targets use the full .venv.
$(VENV_LIGHT)/.synced: $(UV) pyproject.toml uv.lock
	UV_PROJECT_ENVIRONMENT=$(abspath $(VENV_LIGHT)) \
		$(UV) sync --locked --no-default-groups --group tools $(addprefix --extra ,$(LIGHT_EXTRAS))
	@touch $@

.PHONY: venv-light
venv-light: $(VENV_LIGHT)/.synced ## Create .venv-light: operator, gateway, CLI and the tools, without torch (locked)

.PHONY: lock
lock: $(UV) ## Re-resolve uv.lock after changing pyproject.toml
	$(UV) lock

.PHONY: binaries
binaries: venv ## Build (cold, many minutes) or reuse the cached control-plane binaries
	$(PY) -m devstack build

CHART := helm/posttrain-operator
HELM = $(shell $(PY) -c 'from devstack.toolchain.paths import bin_dir; print(bin_dir())')/helm
HELM_KUBE_VERSION := 1.34.4

.PHONY: manifests
manifests: venv ## Regenerate the CRDs (and their copy in the chart) and the images' package lists
	$(PY) -m posttrain_operator.api.crds --write crds
	rm -f $(CHART)/crds/*.yaml
	cp crds/*.yaml $(CHART)/crds/
	$(PY) -m devstack image-packages

.PHONY: verify
verify: venv ## Fail if generated files (CRDs, the chart's copy, the images' package lists) drifted
	$(PY) -m posttrain_operator.api.crds --check crds
	$(PY) -m posttrain_operator.api.crds --check $(CHART)/crds
	diff -r crds $(CHART)/crds
	$(PY) -m devstack image-packages --check

.PHONY: helm-lint
helm-lint: venv binaries ## helm lint --strict the chart at Kubernetes 1.34 and render it with its defaults
	$(HELM) lint --strict --kube-version $(HELM_KUBE_VERSION) $(CHART)
	$(HELM) template lint-check $(CHART) --kube-version $(HELM_KUBE_VERSION) > /dev/null

##@ Test

.PHONY: preflight
preflight: venv
	$(PY) -m devstack.preflight

TEST_WORKERS ?= 2

.PHONY: test
test: venv binaries preflight e2e-images ## Everything this machine can run: unit, integration (real control plane), e2e (kind)
	@# Two sessions: the kind cluster lives as long as its pytest session, and must not load the
	@# machine while the integration tests (CPU-bound training among them) run. Both always run.
	@# The first on $(TEST_WORKERS) workers, a file each at a time, each worker with its own devstack
	@# control plane: its tests mostly wait on one single-threaded job, so one worker left a core idle.
	@status=0; \
	$(PY) -m pytest -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder --durations=25 tests/unit tests/integration || status=1; \
	$(PY) -m pytest --durations=15 tests/e2e || status=1; \
	exit $$status

.PHONY: test-unit
test-unit: venv ## Pure-logic tests only, no cluster
	$(PY) -m pytest tests/unit

# The unit tier on the other Python versions requires-python allows (`make test` runs on $(PYTHON)),
# each in its own .venv-pyX.Y synced from the lock (warm cache: seconds, the files hard-linked from
# uv's cache). UNIT_PYTHONS_FULL get every extra, like .venv, and run the whole tier; UNIT_PYTHONS_LIGHT
# get the light set and the launcher, no torch, and the tests that need a package it lacks are skipped
# naming it (tests/unit/conftest.py): a few minutes instead of the torch tests' training runs. No
# interpreter is downloaded: each is looked for on this machine, and one not found is reported NOT
# TESTED with the reason, never passed.
UNIT_PYTHONS_FULL ?= 3.13
UNIT_PYTHONS_LIGHT ?= 3.12
FIND_PYTHON := devstack/toolchain/find-python.sh

.PHONY: test-unit-versions
test-unit-versions: $(UV) ## The unit tier on Python 3.13 (every extra) and 3.12 (no torch) where this machine has them, in .venv-pyX.Y
	@status=0; summary=(); \
	for entry in $(addsuffix :light,$(UNIT_PYTHONS_LIGHT)) $(addsuffix :full,$(UNIT_PYTHONS_FULL)); do \
		version=$${entry%%:*}; set=$${entry##*:}; venv=.venv-py$$version; \
		if ! python=$$(UV=$(UV) $(FIND_PYTHON) $$version); then \
			echo "SKIPPED: the unit tier on Python $$version: NOT TESTED, no CPython $$version interpreter on this machine (uv python find, pyenv; none is downloaded)"; \
			summary+=("Python $$version ($$set): NOT TESTED (no interpreter)"); continue; \
		fi; \
		if [ $$set = full ]; then sync=(--all-extras); light=0; \
		else sync=(--no-default-groups --group tools $(addprefix --extra ,$(LIGHT_EXTRAS) launcher)); light=1; fi; \
		echo "== the unit tier on Python $$version ($$python) in $$venv ($$set)"; \
		if UV_PYTHON=$$python UV_PROJECT_ENVIRONMENT=$(CURDIR)/$$venv $(UV) sync --locked "$${sync[@]}" \
			&& $(UV) pip install --python $$venv/bin/python --quiet --no-deps $(addprefix --editable ,$(TASK_PLUGINS)) \
			&& POSTTRAIN_LIGHT_VENV=$$light $$venv/bin/python -m pytest tests/unit; then \
			summary+=("Python $$version ($$set): passed ($$python)"); \
		else \
			summary+=("Python $$version ($$set): FAILED ($$python)"); status=1; \
		fi; \
	done; \
	echo "== the unit tier on other Python versions:"; printf '  %s\n' "$${summary[@]}"; \
	exit $$status

.PHONY: test-integration
test-integration: venv binaries preflight ## Tests against the devstack control plane
	$(PY) -m pytest tests/integration

.PHONY: lint
lint: venv ## ruff (lint + format check), mypy strict, and the import contracts (pyproject.toml)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy
	$(VENV)/bin/lint-imports --no-cache

.PHONY: fmt
fmt: venv ## Apply ruff's fixes and formatting
	$(VENV)/bin/ruff check --fix .
	$(VENV)/bin/ruff format .

##@ Demo and local stack

.PHONY: demo
demo: venv binaries preflight ## Fresh machine to rewards: stack up, scripted agent on both tasks, table, teardown
	$(PY) -m devstack.demo

.PHONY: up
up: venv binaries preflight ## Leave the stack running (cluster, HF emulator, operator, gateway); prints how to reach it
	$(PY) -m devstack stack up

.PHONY: down
down: venv ## Stop the stack and the cluster, and remove their state
	$(PY) -m devstack stack down

##@ Devstack

.PHONY: cluster-up
cluster-up: venv binaries ## Start the local control plane (etcd, kube-apiserver, kube-controller-manager)
	$(PY) -m devstack cluster up

.PHONY: cluster-down
cluster-down: venv ## Stop the local control plane and remove its state
	$(PY) -m devstack cluster down

##@ Images and the kind e2e cluster

.PHONY: docker-host
docker-host: ## Install and start Docker (Debian's docker.io), plus the runc wrapper on kernels without CAP_SYS_RESOURCE
	bash devstack/kind/host/docker-setup.sh

.PHONY: images
images: venv docker-host ## Build the operator+gateway, launcher and environment images (tags from the locks and sources; warm: no-op)
	$(PY) -m devstack images

.PHONY: env-locks
env-locks: venv $(UV) ## Re-resolve environments/*/requirements.lock (after changing a requirements.in or uv.lock)
	$(PY) -m devstack env-lock --uv $(UV)

.PHONY: node-image
node-image: venv binaries docker-host ## The kind node image: kindest/node where pullable, else built from Debian packages
	$(PY) -m devstack node-image

# Cold builds happen here, with progress on the terminal, not inside the test session's fixtures.
.PHONY: e2e-images
e2e-images: venv binaries docker-host ## The kind node image and the project images the e2e suite loads
	$(PY) -m devstack node-image
	$(PY) -m devstack images

.PHONY: e2e
e2e: e2e-images ## kind cluster, images loaded, chart installed (--wait), helm test, tests/e2e, cluster deleted
	$(PY) -m pytest tests/e2e -v --durations=5

.PHONY: help
help: ## Show this help
	@awk 'BEGIN {FS = ":.*##"} /^[a-zA-Z_-]+:.*?##/ { printf "  \033[36m%-18s\033[0m %s\n", $$1, $$2 } /^##@/ { printf "\n\033[1m%s\033[0m\n", substr($$0, 5) }' $(MAKEFILE_LIST)
