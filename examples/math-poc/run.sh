#!/usr/bin/env bash
# The math PoC end to end. Two ways to run it:
#
#   examples/math-poc/run.sh --mode mock --runner local     # CPU only: `make demo` runs this
#       the mock vLLM (`agl-lite mock-llm`, GSM8K-format answers, deterministic by seed), the gateway with
#       SQLite and the local runner (one agent process per attempt), and the RL loop (algorithm.py).
#
#   examples/math-poc/run.sh                                # the seed's quick start: vLLM + minikube
#       = --mode vllm --runner k8s: vLLM from scripts/start_vllm.sh (GPU), settings from deploy/.env (copy
#       examples/math-poc/.env.vllm.example), images built and loaded into minikube, the controller deployed
#       there, agl-lite on the host (0.0.0.0, reached from pods as host.minikube.internal), then the RL loop.
#
#   --mode vllm --runner local: a vLLM already serving at $VLLM_URL (e.g. `make demo-vllm-cpu`), local agents.
#
# Options: --iterations N  --problems N  --samples N  --data PATH (GSM8K JSONL)  --seed N  --wrong-rate R (mock)
#          --workdir DIR (default examples/math-poc/.run: the SQLite store, configs and logs stay there)
#          --print-config (print the settings this run would use, deploy/.env included, and start nothing)
# Environment: AGL_KEY (admin key; generated when unset), AGL_DEMO_PYTHON (default .venv/bin/python), VLLM_URL,
#              VLLM_MODEL (the served model name), AGL_DEMO_PORT / AGL_DEMO_MOCK_PORT (default: free ports),
#              AGL_DEMO_ENV_FILE (default deploy/.env; with --runner k8s, read first: the environment wins over it).
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"
MODE=vllm RUNNER=k8s ITERATIONS=2 PROBLEMS=30 SAMPLES=2 SEED=1 WRONG_RATE=0.3
DATA="$HERE/problems.jsonl" WORKDIR="$HERE/.run"

while [ $# -gt 0 ]; do
    case "$1" in
        --mode) MODE="$2"; shift 2 ;;
        --runner) RUNNER="$2"; shift 2 ;;
        --iterations) ITERATIONS="$2"; shift 2 ;;
        --problems) PROBLEMS="$2"; shift 2 ;;
        --samples) SAMPLES="$2"; shift 2 ;;
        --data) DATA="$(cd "$(dirname "$2")" && pwd)/$(basename "$2")"; shift 2 ;;
        --seed) SEED="$2"; shift 2 ;;
        --wrong-rate) WRONG_RATE="$2"; shift 2 ;;
        --workdir) WORKDIR="$2"; shift 2 ;;
        --print-config) PRINT_CONFIG=1; shift ;;
        -h|--help) sed -n '2,20p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
        *) echo "run.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
    esac
done
case "$MODE/$RUNNER" in
    mock/local|vllm/local|vllm/k8s) ;;
    *) echo "run.sh: --mode $MODE --runner $RUNNER is not a combination this example runs" >&2; exit 2 ;;
esac

# deploy/.env (the seed's quick start, --runner k8s) is read first, before anything is derived from it (the ports,
# the public URL); a variable already set in the environment wins over the file, and the file's empty values
# (`AGL_KEY=` in the example) set nothing.
ENV_FILE="${AGL_DEMO_ENV_FILE:-$ROOT/deploy/.env}"
if [ "$RUNNER" = k8s ]; then
    [ -f "$ENV_FILE" ] || { echo "run.sh: copy examples/math-poc/.env.vllm.example to deploy/.env first" >&2; exit 2; }
    while IFS= read -r line || [ -n "$line" ]; do
        case "$line" in ''|'#'*) continue ;; esac
        name="${line%%=*}" value="${line#*=}"
        case "$name" in *[!A-Za-z0-9_]*|'') echo "run.sh: $ENV_FILE: not NAME=value: $line" >&2; exit 2 ;; esac
        value="${value%\"}"; value="${value#\"}"; value="${value%\'}"; value="${value#\'}"
        if [ -n "$value" ] && [ -z "${!name:-}" ]; then export "$name=$value"; fi
    done < "$ENV_FILE"
fi

PY="${AGL_DEMO_PYTHON:-$ROOT/.venv/bin/python}"
[ -x "$PY" ] || { echo "run.sh: no Python at $PY: run 'make demo' (or 'make venv') first, or set AGL_DEMO_PYTHON" >&2; exit 2; }
PY="$(cd "$(dirname "$PY")" && pwd)/$(basename "$PY")"  # absolute (agents run elsewhere), the venv's own link kept
BIN="$(dirname "$PY")"
AGL="$BIN/agl-lite"
free_port() { "$PY" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }

if [ "$RUNNER" = k8s ] && [ -n "${AGL_PUBLIC_URL:-}" ]; then
    # Pods and the controller are told AGL_PUBLIC_URL: its port must be the one the gateway listens on.
    public_port="$(printf '%s' "$AGL_PUBLIC_URL" | sed -nE 's#^[a-z]+://[^/:]+:([0-9]+).*#\1#p')"
    if [ -z "${AGL_DEMO_PORT:-}" ] && [ -n "$public_port" ]; then export AGL_DEMO_PORT="$public_port"; fi
    if [ -n "$public_port" ] && [ "$public_port" != "${AGL_DEMO_PORT}" ]; then
        echo "run.sh: AGL_PUBLIC_URL ($AGL_PUBLIC_URL) says port $public_port, but the gateway would listen on" \
            "$AGL_DEMO_PORT (AGL_DEMO_PORT): make them agree" >&2
        exit 2
    fi
fi
if [ "${PRINT_CONFIG:-}" = 1 ]; then  # what this run would use, and nothing started (tests, and a user's check)
    host=127.0.0.1; [ "$RUNNER" = k8s ] && host=0.0.0.0
    echo "mode=$MODE runner=$RUNNER host=$host port=${AGL_DEMO_PORT:-free} public_url=${AGL_PUBLIC_URL:-}"
    echo "key=$([ -n "${AGL_KEY:-}" ] && echo given || echo generated) vllm_url=${VLLM_URL:-} vllm_model=${VLLM_MODEL:-}"
    exit 0
fi

export AGL_KEY="${AGL_KEY:-$("$PY" -c 'import secrets; print(secrets.token_hex(32))')}"
rm -rf "$WORKDIR"
mkdir -p "$WORKDIR"
PIDS=()
cleanup() {
    for pid in "${PIDS[@]}"; do kill "$pid" 2>/dev/null || true; done
    for pid in "${PIDS[@]}"; do wait "$pid" 2>/dev/null || true; done
}
trap cleanup EXIT
trap 'exit 130' INT TERM

wait_http() {  # URL NAME LOG: poll until it answers, fail fast with the log when the process died
    local url="$1" name="$2" log="$3" pid="$4"
    for _ in $(seq 1 300); do
        if "$PY" -c "import sys, urllib.request; urllib.request.urlopen(sys.argv[1], timeout=1)" "$url" 2>/dev/null; then
            return 0
        fi
        if ! kill -0 "$pid" 2>/dev/null; then
            echo "run.sh: $name exited; the end of its log ($log):" >&2; tail -n 30 "$log" >&2; exit 1
        fi
        sleep 0.1
    done
    echo "run.sh: $name did not answer at $url within 30 s; see $log" >&2; exit 1
}

HOST=127.0.0.1
PORT="${AGL_DEMO_PORT:-$(free_port)}"

# --- the model server ---------------------------------------------------------------------------------------
if [ "$MODE" = mock ]; then
    MOCK_PORT="${AGL_DEMO_MOCK_PORT:-$(free_port)}"
    UPSTREAM="http://127.0.0.1:$MOCK_PORT/v1"
    SERVED=smollm2
    "$AGL" mock-llm --port "$MOCK_PORT" --model "$SERVED" --math "$DATA" --seed "$SEED" --wrong-rate "$WRONG_RATE" \
        >"$WORKDIR/mock-llm.log" 2>&1 &
    PIDS+=($!)
    wait_http "http://127.0.0.1:$MOCK_PORT/v1/models" "the mock vLLM" "$WORKDIR/mock-llm.log" "${PIDS[-1]}"
else
    if [ "$RUNNER" = k8s ]; then
        HOST=0.0.0.0
    fi
    UPSTREAM="${VLLM_URL:-http://127.0.0.1:8000/v1}"
    SERVED="${VLLM_MODEL:-Qwen/Qwen2.5-1.5B-Instruct}"
    "$PY" -c "import sys, urllib.request; urllib.request.urlopen(sys.argv[1] + '/models', timeout=5)" "$UPSTREAM" \
        || { echo "run.sh: no vLLM answers at $UPSTREAM (start it with scripts/start_vllm.sh, or set VLLM_URL)" >&2; exit 2; }
fi

# --- the gateway (store, capture, and the local runner when asked) -------------------------------------------
cat >"$WORKDIR/routes.toml" <<EOF
# The agent asks for gpt-4.1; this maps it to the model the upstream serves.
[models.policy]
aliases = ["gpt-4.1"]
backend = "vllm"
upstreams = [{ base_url = "$UPSTREAM", served_model = "$SERVED" }]
EOF
CHAIN='"store", "auth", "store_api", "dashboard", "control", "metrics", "route", "anthropic", "responses", "capture", "tokens", "sink"'
RUNNER_CFG=""
if [ "$RUNNER" = local ]; then
    CHAIN="$CHAIN, \"runner\""
    RUNNER_CFG="[addons.runner]
backend = \"local\"
command = [\"$PY\", \"$HERE/agent.py\"]
concurrency = ${AGL_DEMO_CONCURRENCY:-8}"
fi
cat >"$WORKDIR/agl-lite.toml" <<EOF
routes = "routes.toml"

[server]
host = "$HOST"
port = $PORT
${AGL_PUBLIC_URL:+public_url = \"$AGL_PUBLIC_URL\"}

[log]
level = "info"

[addons]
chain = [$CHAIN]

[addons.store]
path = "agl-lite.db"

$RUNNER_CFG
EOF
"$AGL" run --config "$WORKDIR/agl-lite.toml" >"$WORKDIR/gateway.log" 2>&1 &
PIDS+=($!)
wait_http "http://127.0.0.1:$PORT/healthz" "the gateway" "$WORKDIR/gateway.log" "${PIDS[-1]}"
export AGL_URL="http://127.0.0.1:$PORT"

if [ "$RUNNER" = k8s ]; then
    "$HERE/k8s.sh" "$WORKDIR"   # images into minikube, the controller deployed against this gateway
fi

# --- the RL loop ----------------------------------------------------------------------------------------------
echo "gateway $AGL_URL ($MODE model at $UPSTREAM, $RUNNER runner); data and logs in $WORKDIR" >&2
status=0
"$PY" "$HERE/algorithm.py" --data "$DATA" --problems "$PROBLEMS" --samples "$SAMPLES" --iterations "$ITERATIONS" \
    ${AGL_DEMO_SUMMARY:+--summary-json "$AGL_DEMO_SUMMARY"} || status=$?

cat <<EOF

Where the data is: $WORKDIR/agl-lite.db (SQLite; the gateway stops when this script ends). With a gateway
running on it (agl-lite run --config $WORKDIR/agl-lite.toml) and AGL_URL / AGL_KEY set:
  agl-client rollouts ls                 # rollouts, their status and reward
  agl-client export calls.jsonl          # one row per captured call: token ids, logprobs, reward
Now, from this run:
EOF
"$BIN/agl-client" --no-progress rollouts ls --limit 5 || true
"$BIN/agl-client" --no-progress export "$WORKDIR/calls.jsonl" || true
exit $status
