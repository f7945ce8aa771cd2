"""Test helpers for agl-lite: fake upstreams and fixtures; nothing here is imported by the gateway itself."""

from agl_lite.testing.mock_vllm import MockVLLM, RecordedRequest, create_app, running_mock, serve
from agl_lite.testing.mock_vllm.scenario import ErrorReply, Scenario, ToolCallSpec

__all__ = [
    "ErrorReply",
    "MockVLLM",
    "RecordedRequest",
    "Scenario",
    "ToolCallSpec",
    "create_app",
    "running_mock",
    "serve",
]
