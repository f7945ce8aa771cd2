"""Run once by the runner's fork server before it forks any agent (`preload` in the runner's config): what every
agent does first (import the SDK, build a client, parse a reply) is then done, and shared, before the fork.
It makes no request and keeps nothing: the agents build their own clients."""

from openai import OpenAI
from openai.types.chat import ChatCompletion

client = OpenAI(api_key="warm-up", base_url="http://127.0.0.1:1/v1", max_retries=0)
client.chat.completions  # noqa: B018 (the resource and its modules load on first use)
ChatCompletion.model_validate(
    {
        "id": "warm-up",
        "object": "chat.completion",
        "created": 0,
        "model": "warm-up",
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": "0"},
                "finish_reason": "stop",
                "logprobs": None,
            }
        ],
        "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
    }
)
client.close()
del client
