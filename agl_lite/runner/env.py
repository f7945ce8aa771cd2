"""The env an attempt starts with: the agent contract (DESIGN.md §2, built by `agl_lite.core.contract`, the same
functions the store API answers with) and, for local processes, the few variables of the runner's own env it is
told to pass on. Nothing else of the runner's env ever reaches an agent; the admin key never does.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping

from agl_lite.core.contract import agent_env, grader_env
from agl_lite.store.records import Rollout

__all__ = ["DEFAULT_PASS_ENV", "FORBIDDEN_ENV", "ContractEnv", "process_env"]

DEFAULT_PASS_ENV = ("PATH", "HOME", "LANG", "LC_ALL", "LC_CTYPE", "TZ", "TMPDIR")
"""What a local agent gets from the runner's env by default: enough to find programs and print text."""
FORBIDDEN_ENV = frozenset({"AGL_KEY"})
"""Never passed on, whatever the config says."""


class ContractEnv:
    """Builds the agent's and the grading step's env for a rollout under one admin key and public URL."""

    def __init__(self, public_url: str, admin_key: str) -> None:
        self.public_url = public_url.rstrip("/")
        self._admin_key = admin_key

    def agent(self, rollout: Rollout, attempt_id: str) -> dict[str, str]:
        """OPENAI_BASE_URL, the agent key, AGL_TASK_INPUT...; `attempt_id` may be `$(AGL_ATTEMPT_ID)`."""
        return agent_env(self.public_url, self._admin_key, rollout, attempt_id)

    def grader(self, rollout: Rollout, attempt_id: str) -> dict[str, str]:
        """The grader key and AGL_GRADE_URL; for the grading step only."""
        return grader_env(self.public_url, self._admin_key, rollout, attempt_id)


def process_env(
    contract: Mapping[str, str],
    *,
    pass_env: Iterable[str],
    extra: Mapping[str, str],
    source: Mapping[str, str] | None = None,
    private: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """A local process's whole env: the named variables of `source` (the runner's env), then `private` (its own
    HOME and TMPDIR in the sandbox), then `extra`, then the contract, which wins; AGL_KEY is dropped whatever the
    config says."""
    src = os.environ if source is None else source
    env = {name: src[name] for name in pass_env if name in src}
    env.update(private or {})
    env.update(extra)
    env.update(contract)
    for name in FORBIDDEN_ENV:
        env.pop(name, None)
    return env
