"""An agent's env is the contract plus what the runner is told to pass; never the admin key."""

from __future__ import annotations

from agl_lite.core.contract import KeyRole, derive_key
from agl_lite.runner.env import ContractEnv, process_env
from agl_lite.store.records import Rollout

ROLLOUT = Rollout("ro-1", {"q": 1}, mode="eval")


def test_the_agent_env_is_the_contract_with_the_agent_key_only() -> None:
    env = ContractEnv("http://gw:8100/", "admin-key-0123456789").agent(ROLLOUT, "at-1")
    assert env["OPENAI_BASE_URL"] == "http://gw:8100/r/ro-1/a/at-1/v1"
    assert env["ANTHROPIC_BASE_URL"] == "http://gw:8100/r/ro-1/a/at-1"
    assert env["OPENAI_API_KEY"] == derive_key("admin-key-0123456789", "ro-1", KeyRole.AGENT)
    assert (env["AGL_TASK_INPUT"], env["AGL_MODE"], env["AGL_ATTEMPT_ID"]) == ('{"q":1}', "eval", "at-1")
    assert derive_key("admin-key-0123456789", "ro-1", KeyRole.GRADER) not in env.values()


def test_the_grader_env_has_the_grader_key_and_url() -> None:
    env = ContractEnv("http://gw", "admin-key-0123456789").grader(ROLLOUT, "at-1")
    assert env["AGL_GRADER_KEY"] == derive_key("admin-key-0123456789", "ro-1", KeyRole.GRADER)
    assert env["AGL_GRADE_URL"] == "http://gw/r/ro-1/a/at-1/grade"
    assert "OPENAI_API_KEY" not in env


def test_a_process_gets_the_named_variables_then_extras_then_the_contract() -> None:
    source = {"PATH": "/bin", "HOME": "/root", "AGL_KEY": "admin", "OTHER": "x"}
    env = process_env(
        {"OPENAI_API_KEY": "agent", "AGL_MODE": "train"},
        pass_env=["PATH", "AGL_KEY", "MISSING"],
        extra={"AGL_MODE": "mine", "EXTRA": "1", "AGL_KEY": "admin"},
        source=source,
    )
    assert env == {"PATH": "/bin", "EXTRA": "1", "OPENAI_API_KEY": "agent", "AGL_MODE": "train"}
