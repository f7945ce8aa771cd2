#!/bin/sh
# Codex CLI (pinned in package.json) as an agl-lite rollout agent. The runner gives it the agent contract: the
# task in AGL_TASK_INPUT ({"prompt": "..."}), the gateway in OPENAI_BASE_URL and the rollout's agent key in
# OPENAI_API_KEY; its HOME is the attempt's own. Codex speaks the Responses API to the gateway, which translates
# it to chat completions and records every turn with vLLM's token ids (docs/responses.md).
#
# `-s danger-full-access`: Codex's own sandbox needs kernel features a container may not give it; the runner
# confines the agent instead (docs/runners.md). Exit status: Codex's.
set -eu
here=$(cd "$(dirname "$0")" && pwd)
export CODEX_HOME="$HOME/.codex"
mkdir -p "$CODEX_HOME"
cp "$here/config.toml" "$CODEX_HOME/config.toml"
prompt=$(python3 -c 'import json, os; print(json.loads(os.environ["AGL_TASK_INPUT"])["prompt"])')
exec "$here/node_modules/.bin/codex" exec --skip-git-repo-check -s danger-full-access \
    -c "model_providers.agl.base_url=\"$OPENAI_BASE_URL\"" "$prompt" </dev/null
