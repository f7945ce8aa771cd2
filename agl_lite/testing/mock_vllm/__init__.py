"""The mock vLLM: an OpenAI-compatible server shaped like vLLM 0.32 on the wire (token ids, logprobs, tool calls,
usage, errors), deterministic from a seed and scriptable by scenarios, for tests and for `agl-lite mock-llm`.

One job per module: `server` (state, the completion endpoints, starting it), `side_routes` (`/v1/models`,
`/tokenize`, `/health`, the `/mock/*` control surface), `generate` (what a choice says), `wire` (vLLM's JSON and
SSE shapes), `http_io` (request parsing and error replies), `tokenizer` (a fake, stable tokenizer), `scenario`
(scripted replies), `faults` and `math_tutor` (scenario hooks). Nothing imports `server` but this package's face.
"""

from agl_lite.testing.mock_vllm.server import MockVLLM, RecordedRequest, create_app, running_mock, serve

__all__ = ["MockVLLM", "RecordedRequest", "create_app", "running_mock", "serve"]
