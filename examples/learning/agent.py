"""The learning demo's agent: a plain program with the plain `openai` SDK, no agl-lite import.

The runner starts it with the agent contract's environment: `AGL_TASK_INPUT` (`{"question": "12+34="}`, never the
answer, which stays in the rollout's metadata) and `OPENAI_BASE_URL` / `OPENAI_API_KEY` (the gateway, with this
rollout in the path, and its agent key). It asks once, samples at temperature 1 and prints the answer; the
algorithm scores what the gateway captured, not what the agent prints.
"""

from __future__ import annotations

import json
import os

from openai import OpenAI


def main() -> None:
    question = json.loads(os.environ["AGL_TASK_INPUT"])["question"]
    client = OpenAI(max_retries=2, timeout=60)
    reply = client.chat.completions.create(
        model=os.environ.get("LEARN_MODEL", "policy"),
        messages=[{"role": "user", "content": question}],
        temperature=1.0,
        max_tokens=6,
    )
    print(question, reply.choices[0].message.content)


if __name__ == "__main__":
    main()
