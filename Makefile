# Two commands for a fresh Debian/Ubuntu machine with Python 3.11: `make plan` and `make test`.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STACK  ?= dev
STAMP  := $(VENV)/.installed

.PHONY: plan test test-all test-minimum lint typecheck unit bench clean tools tools-path FORCE
# What the unit tests select: the fast ones by default; `make test-all` (and CI) run the slow ones too.
PYTEST_ARGS ?= -m "not slow"
# One test process per core (pytest-xdist): the suite is mostly scripts in subprocesses, one core each. `-p no:xdist`
# in PYTEST_ARGS, or PYTEST_WORKERS=, runs it in one process.
PYTEST_WORKERS ?= -n auto

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

# Strict editable install: a link tree of the package that mypy can read (it cannot follow import hooks). A new or
# renamed module needs a reinstall, hence the dependency on the list of modules.
MODULES := $(shell find components stacks -name '*.py' -o -name '*.sh' -o -name '*.json' | sort)
MODLIST := $(VENV)/.modules

$(MODLIST): FORCE | $(BIN)/python
	@echo '$(MODULES)' | cmp -s - $@ || echo '$(MODULES)' > $@

$(STAMP): pyproject.toml $(MODLIST) | $(BIN)/python
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[test]' --config-settings editable_mode=strict
	touch $@

FORCE:

## Offline plan of a stack (default dev) under Pulumi's mock engine: no CLI, no credentials.
plan: $(STAMP)
	$(BIN)/python -m proxmox_gpu_cluster.plan $(STACK) --placeholder-secrets

## Lint, type checks and the fast tests (leaves out the tests marked slow).
test: lint typecheck unit

## Everything, the slow tests included (what CI runs).
test-all:
	$(MAKE) test PYTEST_ARGS=

lint: $(STAMP)
	$(BIN)/ruff check components stacks tests benchmarks examples __main__.py
	$(BIN)/ruff format --check components stacks tests benchmarks examples __main__.py

typecheck: $(STAMP)
	$(BIN)/mypy
	for f in __main__.py $(wildcard examples/*/__main__.py); do $(BIN)/mypy "$$f" || exit 1; done

unit: $(STAMP)
	$(BIN)/python -m pytest -q $(PYTEST_WORKERS) $(PYTEST_ARGS)

# What the floors cannot change: the node scripts and the node agent run with bash and the stdlib on the machines
# (tests/components/scripts, tests/agent), and the real tools the tests build (make tools) are the same binaries.
MINIMUM_SKIP := --ignore=tests/components/scripts --ignore=tests/agent --ignore=tests/test_tools.py

## The test suite once more against the declared dependency floors (constraints/minimum.txt), in .venv-minimum.
test-minimum: | $(BIN)/python
	$(PYTHON) -m venv .venv-minimum
	.venv-minimum/bin/python -m pip install --quiet --upgrade pip
	.venv-minimum/bin/python -m pip install --quiet -c constraints/minimum.txt -e '.[test]' --config-settings editable_mode=strict
	.venv-minimum/bin/python -m pip list --format=freeze | grep -iE '^(pulumi|pydantic|pyyaml)'
	.venv-minimum/bin/python -m pytest -q -p no:cacheprovider $(PYTEST_WORKERS) $(PYTEST_ARGS) $(MINIMUM_SKIP)
	$(BIN)/python -m pip install --quiet -e '.[test]' --config-settings editable_mode=strict

## Offline-plan scale benchmark (prints wall time and peak memory for 1..1000 workers).
bench: $(STAMP)
	$(BIN)/python benchmarks/plan_scale.py

clean:
	rm -rf $(VENV) .venv-minimum build .pytest_cache .mypy_cache .ruff_cache

## The real tools the tests run (Go builds and Debian binaries at pinned versions), into a cache outside the clone;
## a second run takes seconds. `make -s tools-path` prints the folder that holds them (bin/ inside).
tools:
	bash tools/tools.sh build

tools-path:
	@bash tools/tools.sh path
