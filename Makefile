# The two commands a newcomer needs:
#   make demo   runs amp locally (static namespaces, dev certificate, example endpoints)
#   make test   runs the whole test suite (installs everything it needs first)
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: demo test venv tools bench clean

$(STAMP): setup.py
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[test,bench]' --config-settings editable_mode=compat
	$(PY) -c "from twisted.plugin import IPlugin, getPlugins; list(getPlugins(IPlugin))"
	touch $(STAMP)

venv: $(STAMP)

# Tools the suite and the benchmark need besides Python packages (wrk; the
# e2e tests' kube-apiserver and etcd), cached under ~/.cache; see tools/install.
tools:
	tools/install

demo: $(STAMP)
	$(PY) -m amp.demo

# On every CPU (pytest-xdist); tests/conftest.py keeps together what shares a run.
test: $(STAMP) tools
	$(PY) -m pytest -n auto --dist loadgroup

bench: $(STAMP) tools
	$(PY) bench/run

clean:
	rm -rf $(VENV) dev-tls .pytest_cache
