# The two commands: `make demo` (set up, build the embedded demo mix, print its summary) and
# `make test` (set up, run the test suite). Everything else is a convenience.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV ?= .venv
BIN := $(VENV)/bin

.PHONY: setup demo test lint ui clean

setup: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml $(wildcard requirements/*.txt)
	$(PYTHON) -m venv $(VENV)
	# torch first and pinned: anything else would pull a multi-GB CUDA build (see docs/design.md); the
	# package itself asks only for a floor, so a training node keeps its own torch
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -e '.[all,dev]'
	touch $@

demo: setup
	$(BIN)/weir demo-data
	$(BIN)/weir build mixes/demo.yaml --out build/demo

# what CI runs (.ci/run): the house rules first (seconds), then the suite
test: lint
	$(BIN)/pytest -q -n 2 --dist loadfile

lint: setup
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy

ui: setup
	$(BIN)/weir ui

clean:
	rm -rf build .dagster_home
