# The two commands a newcomer needs:
#   make demo   runs amp locally (static namespaces, dev certificate, example endpoints;
#               python -m amp_dev.demo from examples/, which is not part of amp)
#   make test   runs the whole test suite (installs everything it needs first)
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
# The locks (hashed, from `make lock`): amp's runtime dependencies (what the
# image installs), and those plus the test and bench extras and the
# examples' dependencies (what `make venv` installs).
RUNTIME_LOCK := requirements/amp.lock
DEV_LOCK := requirements/dev.lock
# The Pythons amp supports (setup.py's python_requires and classifiers say the
# same; tests/integration/deploy/test_packaging.py checks): `make test-pythons`
# runs the unit suite on each that pyenv has here.  `make test` runs on $(PYTHON).
PYTHONS := 3.11 3.12 3.13
PYENV_ROOT ?= $(HOME)/.pyenv
# The unit suite: without the tests that need the tools of `make tools` (the
# end-to-end control plane, wrk, helm, kustomize, promtool) or take minutes.
UNIT_ONLY := --ignore=tests/e2e --ignore=tests/integration/bench \
	--ignore=tests/integration/deploy/test_chart.py --ignore=tests/integration/deploy/test_deploy.py \
	--ignore=tests/integration/deploy/test_monitoring.py
# uv compiles the locks; pinned, in a virtualenv of its own.
UV_VERSION := 0.13.9
UV_VENV := .venv-uv
UV := $(UV_VENV)/bin/uv
LOCK_FLAGS := --universal --python-version 3.11 --generate-hashes --custom-compile-command "make lock" -q

.PHONY: demo test test-pythons check venv lock schema tools bench clean image image-check

# The locked dependencies with their hashes (pip refuses anything else),
# then amp and the examples themselves without dependencies.
$(STAMP): setup.py examples/pyproject.toml $(DEV_LOCK)
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --require-hashes -r $(DEV_LOCK)
	$(PY) -m pip install -q --no-deps --no-build-isolation -e . -e ./examples --config-settings editable_mode=compat
	$(PY) -c "from twisted.plugin import IPlugin, getPlugins; list(getPlugins(IPlugin))"
	touch $(STAMP)

venv: $(STAMP)

$(UV):
	$(PYTHON) -m venv $(UV_VENV)
	$(UV_VENV)/bin/python -m pip install -q uv==$(UV_VERSION)

# Refresh both locks from setup.py and examples/pyproject.toml (after a
# dependency is added or its range changes): newest versions in range, for
# every Python amp supports.  The dev lock is constrained by the runtime one,
# so the tests run what the image ships.  The build lock pins the build
# backend the image builds amp's wheel with (requirements/build.in).
lock: $(UV)
	$(UV) pip compile setup.py $(LOCK_FLAGS) --upgrade -o $(RUNTIME_LOCK)
	$(UV) pip compile requirements/build.in $(LOCK_FLAGS) --upgrade -o requirements/build.lock
	$(UV) pip compile setup.py examples/pyproject.toml --extra test --extra bench -c $(RUNTIME_LOCK) \
		$(LOCK_FLAGS) --upgrade -o $(DEV_LOCK)
	@# uv ran setup.py egg_info here; a stale egg-info beside the editable install would shadow its metadata.
	rm -rf amp.egg-info examples/amp_examples.egg-info
	@echo "make lock: refreshed $(RUNTIME_LOCK) and $(DEV_LOCK); run make venv to install them"

# The chart's values.schema.json: its config part from amp's config declaration.
schema: $(STAMP)
	$(PY) -m amp.schema --write deploy/chart/amp/values.schema.json

# Tools the suite and the benchmark need besides Python packages (wrk; the
# e2e tests' kube-apiserver and etcd; helm, kustomize and promtool for the
# deploy tests), cached under ~/.cache; see tools/install and
# tools/install-deploy-tools.
tools:
	tools/install
	tools/install-deploy-tools

# amp's container image, amp:<version>, from the Dockerfile with podman or
# Docker, whichever runs here (tools/image.py; tools/install image provides
# podman and the base image where neither is there).  image-check: nothing
# inside that should not be (compiler, package caches, tests), and a second
# build without cache has the same files and configuration (a cold build).
image:
	tools/install image
	$(PYTHON) tools/image.py build

image-check: image
	$(PYTHON) tools/image.py contents
	$(PYTHON) tools/image.py reproducible

demo: $(STAMP)
	$(PY) -m amp_dev.demo

# On every CPU (pytest-xdist); tests/conftest.py keeps together what shares a run.
test: $(STAMP) tools
	$(PY) -m pytest -n auto --dist loadgroup

# The static checks alone (tests/unit/repo/test_static_checks.py runs the same in
# make test): mypy strict on amp/ (mypy.ini), ruff's lint and its format
# check on the whole repository (ruff.toml).  All three run even when one fails.
check: $(STAMP)
	@status=0; \
	$(PY) -m mypy --config-file mypy.ini || status=1; \
	$(PY) -m ruff check . || status=1; \
	$(PY) -m ruff format --check . || status=1; \
	exit $$status

# The unit suite (no end-to-end, bench or deploy-tool tests) on each of
# $(PYTHONS) that pyenv has here, each in a venv of its own from the lock.
test-pythons:
	@set -e; ran=""; for v in $(PYTHONS); do \
	  py=$$(ls -d $(PYENV_ROOT)/versions/$$v.* 2>/dev/null | sort -V | tail -1); \
	  if [ -z "$$py" ]; then echo "test-pythons: no Python $$v in $(PYENV_ROOT)/versions"; continue; fi; \
	  $(MAKE) --no-print-directory venv PYTHON=$$py/bin/python VENV=.venv-$$v; \
	  .venv-$$v/bin/python -m pytest -q -n auto --dist loadgroup $(UNIT_ONLY); \
	  ran="$$ran $$v"; \
	done; [ -n "$$ran" ] || { echo "test-pythons: none of $(PYTHONS) found"; exit 1; }; echo "test-pythons: passed on$$ran"

bench: $(STAMP) tools
	$(PY) bench/run

clean:
	rm -rf $(VENV) $(UV_VENV) $(foreach v,$(PYTHONS),.venv-$(v)) dev-tls .pytest_cache .mypy_cache .ruff_cache
