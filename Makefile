# streamlab: one entry point for setting up, running and testing.
#   make quickstart   set up, then run the quickstart job on an embedded local cluster
#   make test         set up, then run the whole test suite
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: setup quickstart test test-fast cluster-start cluster-stop clean check-python check-java

setup: $(STAMP)

$(STAMP): pyproject.toml | check-python check-java
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[test]'
	touch $(STAMP)

check-python:
	@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else 1)' || { \
	  echo "streamlab needs Python 3.11 or newer (found: $$($(PYTHON) --version 2>&1))."; \
	  echo "Install it, or use conda: conda env create -f environment.yml && conda activate streamlab"; exit 1; }

check-java:
	@java -version 2>&1 | grep -Eq 'version "(1[7-9]|[2-9][0-9])' || { \
	  echo "warning: Java 17+ not found. Spark operators need it: install OpenJDK 17"; \
	  echo "  (Debian/Ubuntu: apt-get install openjdk-17-jre-headless; conda: environment.yml has it)"; }

quickstart: setup
	$(PY) examples/keyed_count.py

test: setup
	$(PY) -m pytest

test-fast: setup
	$(PY) -m pytest -m "not slow"

cluster-start: setup
	$(VENV)/bin/streamlab cluster start --taskmanagers 2 --slots 2

cluster-stop: setup
	$(VENV)/bin/streamlab cluster stop

clean:
	rm -rf $(VENV) *.egg-info .pytest_cache
