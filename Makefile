# The two commands a newcomer needs:
#   make demo   runs amp locally (static namespaces, dev certificate, example endpoints;
#               python -m amp_dev.demo from examples/, which is not part of amp)
#   make test   runs the whole test suite (installs everything it needs first)
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: demo test venv bench clean

$(STAMP): setup.py examples/pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[test,bench]' -e './examples[test]' --config-settings editable_mode=compat
	$(PY) -c "from twisted.plugin import IPlugin, getPlugins; list(getPlugins(IPlugin))"
	touch $(STAMP)

venv: $(STAMP)

demo: $(STAMP)
	$(PY) -m amp_dev.demo

test: $(STAMP)
	$(PY) -m pytest

bench: $(STAMP)
	$(PY) bench/run

clean:
	rm -rf $(VENV) dev-tls .pytest_cache
