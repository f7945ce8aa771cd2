#!/usr/bin/env bash
# Start vLLM's OpenAI-compatible server on a GPU for the math PoC (the seed's quick start): Qwen2.5-1.5B-Instruct on
# :8000, served under its own name, which is what examples/math-poc/.env.vllm.example's VLLM_MODEL says.
#
#   scripts/start_vllm.sh                         # foreground; Ctrl-C stops it
#   scripts/start_vllm.sh --enforce-eager         # anything after the script's name goes to vLLM as it is
#
# Environment (defaults in brackets):
#   VLLM_PYTHON [python3]      a Python with vLLM installed (`pip install vllm`, in a venv of its own)
#   VLLM_HF_MODEL [Qwen/Qwen2.5-1.5B-Instruct]   the model to load (a hub id, or a local directory)
#   VLLM_MODEL [= VLLM_HF_MODEL]   the served name: what the gateway's routes.toml calls `served_model`
#   VLLM_HOST [127.0.0.1]  VLLM_PORT [8000]  VLLM_MAX_MODEL_LEN [8192]  VLLM_GPU_MEMORY_UTILIZATION [0.85]
#   VLLM_TOOL_PARSER [hermes]  the parser for --enable-auto-tool-choice (Qwen2.5 emits Hermes-style tool calls);
#                              set it empty for a model without tool calls
#   VLLM_API_KEY []            when exported, vLLM reads it itself (off the command line, so not in `ps`) and
#                              requires it; give it to the gateway with `api_key_env` in routes.toml
#
# The gateway asks vLLM for token ids (`return_token_ids`, vLLM >= 0.10.2), so any recent vLLM works.
# NOT tested in this repository (its CI has no GPU). The CPU path, which is exercised, is scripts/vllm_cpu.sh
# (`make demo-vllm-cpu`, docs/vllm-cpu.md); both start the same server module with the same kind of flags.
set -euo pipefail

VLLM_PYTHON="${VLLM_PYTHON:-python3}"
VLLM_HF_MODEL="${VLLM_HF_MODEL:-Qwen/Qwen2.5-1.5B-Instruct}"
VLLM_MODEL="${VLLM_MODEL:-$VLLM_HF_MODEL}"
VLLM_HOST="${VLLM_HOST:-127.0.0.1}"
VLLM_PORT="${VLLM_PORT:-8000}"
VLLM_MAX_MODEL_LEN="${VLLM_MAX_MODEL_LEN:-8192}"
VLLM_GPU_MEMORY_UTILIZATION="${VLLM_GPU_MEMORY_UTILIZATION:-0.85}"
VLLM_TOOL_PARSER="${VLLM_TOOL_PARSER-hermes}"

case "${1:-}" in
    -h|--help) sed -n '2,20p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
esac

"$VLLM_PYTHON" -c 'import vllm' 2>/dev/null || {
    echo "start_vllm.sh: $VLLM_PYTHON cannot import vllm: install it (pip install vllm) or set VLLM_PYTHON" >&2
    exit 2
}
command -v nvidia-smi >/dev/null || echo "start_vllm.sh: no nvidia-smi on the PATH; vLLM needs a GPU here (for CPU see scripts/vllm_cpu.sh)" >&2

args=(
    -m vllm.entrypoints.openai.api_server
    --model "$VLLM_HF_MODEL"
    --served-model-name "$VLLM_MODEL"
    --host "$VLLM_HOST"
    --port "$VLLM_PORT"
    --max-model-len "$VLLM_MAX_MODEL_LEN"
    --gpu-memory-utilization "$VLLM_GPU_MEMORY_UTILIZATION"
)
if [ -n "$VLLM_TOOL_PARSER" ]; then
    args+=(--enable-auto-tool-choice --tool-call-parser "$VLLM_TOOL_PARSER")
fi
echo "start_vllm.sh: $VLLM_HF_MODEL as '$VLLM_MODEL' on http://$VLLM_HOST:$VLLM_PORT/v1" >&2
exec "$VLLM_PYTHON" "${args[@]}" "$@"
