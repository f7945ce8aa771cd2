# agl-lite — the two commands: `make demo` (arrives with the math PoC) and `make test`.
# Everything runs from a virtual environment this Makefile creates; nothing depends on the machine's packages.

PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
PIP    := $(BIN)/python -m pip --disable-pip-version-check -q

.PHONY: help venv lint typecheck test test-fast run demo bench-gateway bench-store docs clean

help:
	@echo "make test           lint, types, layering and the whole test suite (creates $(VENV))"
	@echo "make run            the gateway on :8100 in front of the mock vLLM on :8000"
	@echo "make bench-gateway  side-by-side gateway benchmark (needs 'hey': apt-get install hey)"
	@echo "make bench-store    store figures on SQLite and memory, side by side, and the gateway with full capture"
	@echo "make docs           regenerate the generated parts of docs/"

$(STAMP): pyproject.toml constraints.txt
	@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else "Python >= 3.11 is required")'
	$(PYTHON) -m venv $(VENV)
	$(PIP) install --upgrade pip
	$(PIP) install -c constraints.txt -e '.[dev]'
	@touch $@

venv: $(STAMP)

lint: $(STAMP)
	$(BIN)/ruff check agl_lite tests bench examples scripts
	$(BIN)/ruff format --check agl_lite tests bench examples scripts
	$(BIN)/lint-imports --no-cache

typecheck: $(STAMP)
	$(BIN)/mypy

test: lint typecheck
	$(BIN)/python -m pytest

test-fast: $(STAMP)
	$(BIN)/python -m pytest -x -q

run: $(STAMP)
	@export AGL_KEY=$${AGL_KEY:-$$($(BIN)/python -c 'import secrets; print(secrets.token_hex(32))')}; \
	echo "AGL_KEY=$$AGL_KEY"; \
	$(BIN)/agl-lite mock-llm --port 8000 --model smollm2 & mock=$$!; \
	trap 'kill $$mock 2>/dev/null' EXIT INT TERM; \
	$(BIN)/agl-lite run --config agl-lite.toml

demo:
	@echo "make demo (the math PoC end to end on CPU) is not built yet; until it is, 'make run' starts the gateway" >&2
	@echo "in front of the mock vLLM (see README.md)." >&2
	@exit 2

bench-gateway: $(STAMP)
	@command -v hey >/dev/null || { echo "bench-gateway needs 'hey' (apt-get install hey)"; exit 2; }
	$(BIN)/python bench/gateway.py --markdown

bench-store: $(STAMP)
	@command -v hey >/dev/null || { echo "bench-store needs 'hey' (apt-get install hey)"; exit 2; }
	$(BIN)/python bench/store.py --markdown

docs: $(STAMP)
	$(BIN)/python scripts/gen_docs.py

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache
