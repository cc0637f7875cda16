# The two commands a newcomer needs:
#   make demo   runs amp locally (static namespaces, dev certificate, example endpoints)
#   make test   runs the whole test suite (installs everything it needs first)
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: demo test venv bench clean tools

$(STAMP): setup.py
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[test,bench]' --config-settings editable_mode=compat
	$(PY) -c "from twisted.plugin import IPlugin, getPlugins; list(getPlugins(IPlugin))"
	touch $(STAMP)

venv: $(STAMP)

demo: $(STAMP)
	$(PY) -m amp.demo

# Command-line tools the tests run (helm, kustomize, promtool), built or
# extracted once into ~/.cache/amp-tools.
tools:
	tools/install-deploy-tools

test: $(STAMP) tools
	$(PY) -m pytest

bench: $(STAMP)
	$(PY) bench/run

clean:
	rm -rf $(VENV) dev-tls .pytest_cache
