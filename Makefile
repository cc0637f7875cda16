# The two commands a newcomer needs:
#   make demo   runs amp locally (static namespaces, dev certificate, example endpoints;
#               python -m amp_dev.demo from examples/, which is not part of amp)
#   make test   runs the whole test suite (installs everything it needs first)
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: demo test venv tools bench clean

$(STAMP): setup.py examples/pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[test,bench]' -e './examples[test]' --config-settings editable_mode=compat
	$(PY) -c "from twisted.plugin import IPlugin, getPlugins; list(getPlugins(IPlugin))"
	touch $(STAMP)

venv: $(STAMP)

# Tools the suite and the benchmark need besides Python packages (wrk; the
# e2e tests' kube-apiserver and etcd; helm, kustomize and promtool for the
# deploy tests), cached under ~/.cache; see tools/install and
# tools/install-deploy-tools.
tools:
	tools/install
	tools/install-deploy-tools

demo: $(STAMP)
	$(PY) -m amp_dev.demo

# On every CPU (pytest-xdist); tests/conftest.py keeps together what shares a run.
test: $(STAMP) tools
	$(PY) -m pytest -n auto --dist loadgroup

bench: $(STAMP) tools
	$(PY) bench/run

clean:
	rm -rf $(VENV) dev-tls .pytest_cache
