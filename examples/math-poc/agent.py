"""The math PoC's agent: a plain program, no agl-lite import — any language would do (see docs/runners.md).

The runner starts it with the agent contract's environment (DESIGN.md §2):
- `AGL_TASK_INPUT`: the task as JSON, here `{"question": "..."}` — never the reference answer, which stays in the
  rollout's metadata where agent keys cannot read it (a large input comes through `AGL_TASK_URL` instead);
- `OPENAI_BASE_URL` / `OPENAI_API_KEY`: the gateway, with this rollout and attempt in the path, and the rollout's
  agent key; the standard `OpenAI()` client reads both;
- `AGL_EVENT_URL`: where to post custom events (here the agent's own final answer, for the logs).

It asks for a model by the name the trainer's code uses (`gpt-4.1`); `routes.toml` maps it to the served model.
"""

from __future__ import annotations

import json
import os
import re
import sys
import urllib.request

from openai import OpenAI

MODEL = os.environ.get("MATH_AGENT_MODEL", "gpt-4.1")
SYSTEM = (
    "You are a careful math tutor. Solve the problem step by step, then give the final answer on its own line "
    "as '#### <number>'."
)


def task() -> dict[str, str]:
    raw = os.environ.get("AGL_TASK_INPUT")
    if raw is None:  # a large input is served by the gateway instead of the environment
        req = urllib.request.Request(
            os.environ["AGL_TASK_URL"], headers={"Authorization": f"Bearer {os.environ['OPENAI_API_KEY']}"}
        )
        with urllib.request.urlopen(req, timeout=30) as resp:
            raw = resp.read().decode()
    return json.loads(raw)


def post_event(kind: str, data: dict[str, object]) -> None:
    url = os.environ.get("AGL_EVENT_URL")
    if not url:
        return
    req = urllib.request.Request(
        url,
        data=json.dumps({"kind": kind, "data": data}).encode(),
        headers={
            "Authorization": f"Bearer {os.environ['OPENAI_API_KEY']}",
            "Content-Type": "application/json",
        },
        method="POST",
    )
    with urllib.request.urlopen(req, timeout=30):
        pass


def main() -> int:
    question = task()["question"]
    client = OpenAI(max_retries=2, timeout=120)
    reply = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "system", "content": SYSTEM}, {"role": "user", "content": question}],
        temperature=0.7,
        max_tokens=256,
    )
    text = reply.choices[0].message.content or ""
    m = re.search(r"####\s*(-?[\d,]*\.?\d+)", text)
    post_event("answer", {"answer": m.group(1).replace(",", "") if m else None})
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
