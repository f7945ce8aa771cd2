"""A rollout agent written with the OpenAI Agents SDK, unchanged: no agl-lite import (docs/responses.md).

The SDK speaks the Responses API by default; the gateway's `responses` addon translates each turn to chat
completions against vLLM, so every turn is captured with vLLM's exact token ids and the turns of one run merge into
one training row, as a chat agent's do. The runner starts it with the agent contract's environment:
`AGL_TASK_INPUT` (here `{"question": "..."}`), and `OPENAI_BASE_URL` / `OPENAI_API_KEY` (this rollout's path on
the gateway and its agent key), which the SDK's default client reads. `AGL_EVENT_URL` takes its final answer.

Run it under the local runner (`[addons.runner] command = ["python", "examples/agents-sdk/agent.py"]`); it needs
`pip install openai-agents`.
"""

from __future__ import annotations

import ast
import asyncio
import json
import operator
import os
import urllib.request

import agents

MODEL = os.environ.get("AGENT_MODEL", "gpt-4.1")
_OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv}


def _value(node: ast.AST) -> float:
    """Arithmetic only (numbers, + - * /, parentheses): the model's expression is never `eval`ed."""
    if (
        isinstance(node, ast.Constant)
        and isinstance(node.value, int | float)
        and not isinstance(node.value, bool)
    ):
        return node.value
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        return -_value(node.operand)
    if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
        return _OPS[type(node.op)](_value(node.left), _value(node.right))
    raise ValueError("only numbers and + - * / are allowed")


@agents.function_tool
def calculate(expression: str) -> str:
    """Evaluate an arithmetic expression, such as `15 * 7 * 3`."""
    try:
        return str(_value(ast.parse(expression, mode="eval").body))
    except (SyntaxError, ValueError, ZeroDivisionError) as exc:
        return f"error: {exc}"


def post_event(kind: str, data: dict[str, object]) -> None:
    req = urllib.request.Request(
        os.environ["AGL_EVENT_URL"],
        data=json.dumps({"kind": kind, "data": data}).encode(),
        headers={
            "Authorization": f"Bearer {os.environ['OPENAI_API_KEY']}",
            "Content-Type": "application/json",
        },
        method="POST",
    )
    with urllib.request.urlopen(req, timeout=30):
        pass


async def main() -> None:
    agents.set_tracing_disabled(
        True
    )  # the SDK would send traces to OpenAI: an agent reaches only its gateway
    question = json.loads(os.environ["AGL_TASK_INPUT"])["question"]
    agent = agents.Agent(
        name="calculator",
        instructions="Use the calculate tool for arithmetic, then answer with the number alone.",
        tools=[calculate],
        model=MODEL,
    )
    result = await agents.Runner.run(agent, question, max_turns=6)
    print(result.final_output)
    post_event("answer", {"text": str(result.final_output)})


if __name__ == "__main__":
    asyncio.run(main())
