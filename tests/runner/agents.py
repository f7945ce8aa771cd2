"""Agent and grader scripts the runner tests of both backends run: plain programs with only the agent contract's
env, as users write them (sh + curl is the "any language" case); and the harness methods both tests' setups share."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from agl_lite.client import AglLiteClient
from agl_lite.store.records import Rollout
from agl_lite.store.rules import RolloutSpec


class RunnerHarness:
    """Scripts on disk, enqueue and wait, for a setup dataclass with `client` and `dir` fields."""

    client: AglLiteClient
    dir: Path
    wait_s: float = 30.0
    """How long `wait` allows by default: generous, a loaded machine is slow."""

    def script(self, name: str, text: str) -> str:
        path = self.dir / name
        path.write_text(text)
        return str(path)

    async def enqueue(self, specs: Sequence[RolloutSpec]) -> list[str]:
        return [r.id for r in await self.client.enqueue(specs)]

    async def wait(self, ids: Sequence[str], timeout: float | None = None) -> dict[str, Rollout]:
        """Until every rollout in `ids` is terminal."""
        timeout = self.wait_s if timeout is None else timeout
        result = await self.client.wait(ids, timeout, poll_s=timeout)
        assert result.pending == []
        return {r.id: r for r in result.rollouts}

    async def follow_completions(self, count: int, wait_s: float) -> dict[str, Rollout]:
        """The first `count` rollouts to turn terminal, read by following the completion cursor as a trainer does."""
        seen: dict[str, Rollout] = {}
        cursor = 0
        while len(seen) < count:
            rows, cursor = await self.client.completed(cursor, wait=wait_s)
            seen.update((r.id, r) for r in rows)
        return seen


SH_AGENT = """
set -eu
auth="Authorization: Bearer $OPENAI_API_KEY"
json="Content-Type: application/json"
curl -sf -H "$auth" -H "$json" "$OPENAI_BASE_URL/chat/completions" \\
  -d '{"model": "smollm2", "messages": [{"role": "user", "content": "hello from sh"}], "max_tokens": 8}'
curl -sf -H "$auth" -H "$json" "$AGL_EVENT_URL" -d '{"kind": "note", "data": {"lang": "sh"}}'
"""

GRADED_AGENT = """
import json, os
task = json.loads(os.environ["AGL_TASK_INPUT"])
with open(task["env_dump"], "w") as f:
    json.dump(dict(os.environ), f)
with open(os.path.join(os.environ["AGL_RESULT_DIR"], "answer.txt"), "w") as f:
    f.write(str(task["a"] + task["b"]))
"""

GRADER = """
import json, os, urllib.request

def call(method, body=None):
    request = urllib.request.Request(
        os.environ["AGL_GRADE_URL"],
        method=method,
        data=None if body is None else json.dumps(body).encode(),
        headers={"Authorization": "Bearer " + os.environ["AGL_GRADER_KEY"], "Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request) as response:
        return json.load(response)

rollout = call("GET")  # its metadata holds the reference answer, which the agent cannot read
with open(os.path.join(os.environ["AGL_RESULT_DIR"], "answer.txt")) as f:
    answer = f.read()
call("POST", {"kind": "reward", "value": 1.0 if answer == str(rollout["metadata"]["expected"]) else 0.0})
"""
