# Two commands for a fresh Debian/Ubuntu machine with Python 3.11: `make plan` and `make test`.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STACK  ?= dev
STAMP  := $(VENV)/.installed

.PHONY: plan test lint typecheck unit bench clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

$(STAMP): pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[test]'
	touch $@

## Offline plan of a stack (default dev) under Pulumi's mock engine: no CLI, no credentials.
plan: $(STAMP)
	$(BIN)/python -m stacks.plan $(STACK)

## Everything: lint, type checks, tests.
test: lint typecheck unit

lint: $(STAMP)
	$(BIN)/ruff check components stacks tests benchmarks __main__.py
	$(BIN)/ruff format --check components stacks tests benchmarks __main__.py

typecheck: $(STAMP)
	$(BIN)/mypy

unit: $(STAMP)
	$(BIN)/python -m pytest -q

## Offline-plan scale benchmark (prints wall time and peak memory for 1..1000 workers).
bench: $(STAMP)
	$(BIN)/python benchmarks/plan_scale.py

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
