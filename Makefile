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

# Command-line tools the suite and the benchmark need (wrk, ...), cached under
# ~/.cache/amp-tools; see tools/install.
tools:
	tools/install

demo: $(STAMP)
	$(PY) -m amp.demo

test: $(STAMP) tools
	$(PY) -m pytest

bench: $(STAMP) tools
	$(PY) bench/run

clean:
	rm -rf $(VENV) dev-tls .pytest_cache
