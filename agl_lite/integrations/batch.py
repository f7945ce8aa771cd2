"""Rows to the padded tensors VERL trains on, as flat row-major arrays (no torch here: `verl/dataproto.py` wraps
them without a copy).

Per row, prompt length P and response length R fixed by the config: `prompts` left-padded, `responses`
right-padded, `input_ids` = both, `attention_mask` 1 on every real token (observations too), `position_ids` =
max(cumsum(attention_mask) - 1, 0) as VERL computes them, `response_mask` 1 on trained tokens only,
`token_level_scores` with the outcome on the last valid response token and step rewards on their steps' last
tokens, `rollout_log_probs` (0 off the mask) when every row has them from one model version, and `is_drop_mask`
for prompts longer than P (kept, truncated to their last P tokens, so group statistics still see them; dropped
after advantages). Responses longer than R are cut to their first R tokens and counted.
"""

from __future__ import annotations

from array import array
from dataclasses import dataclass, field

from agl_lite.integrations.rewards import RowRewards
from agl_lite.integrations.trajectory import Row

__all__ = ["Batch", "BatchBuilder", "BatchConfig", "BatchStats"]


@dataclass(frozen=True, slots=True)
class BatchConfig:
    max_prompt_length: int
    """P: prompts are left-padded (or cut, and the row marked for dropping) to this many tokens."""
    max_response_length: int
    """R: responses are right-padded (or cut, and counted) to this many tokens."""
    pad_token_id: int

    def __post_init__(self) -> None:
        if self.max_prompt_length < 1 or self.max_response_length < 1:
            raise ValueError("max_prompt_length and max_response_length must be at least 1")


@dataclass(slots=True)
class BatchStats:
    rows: int = 0
    truncated_responses: int = 0
    dropped_prompts: int = 0
    """Rows whose prompt was longer than P (marked in `is_drop_mask`)."""
    lost_step_rewards: int = 0
    """Step rewards whose step was cut off with the end of a response."""
    unplaced_rewards: int = 0
    """Outcome rewards of rows without any response token."""
    prompt_tokens: int = 0
    response_tokens: int = 0
    trained_tokens: int = 0


@dataclass(slots=True, eq=False)
class Batch:
    """The batch, each tensor flat and row-major: `prompts` is size × prompt_length, and so on."""

    size: int
    prompt_length: int
    response_length: int
    prompts: array[int]
    responses: array[int]
    input_ids: array[int]
    attention_mask: array[int]
    position_ids: array[int]
    response_mask: array[int]
    token_level_scores: array[float]
    rollout_log_probs: array[float] | None
    is_drop_mask: array[int]
    uid: list[str]
    """The GRPO group of each row (its rollout's group id)."""
    rollout_ids: list[str]
    model_versions: list[str | None]
    sources: list[list[tuple[str | None, int, int]]]
    """Per row, the calls it trains: (response id, start, end) of each one's tokens in the row's response (cut
    to R). What a fidelity check compares with what the server says it sampled."""
    stats: BatchStats

    def rows(self, name: str) -> list[list[int]] | list[list[float]]:
        """One field as a list of rows (tests and debugging)."""
        flat = getattr(self, name)
        width = len(flat) // self.size if self.size else 0
        return [flat[i * width : (i + 1) * width].tolist() for i in range(self.size)]


@dataclass(slots=True, eq=False)
class BatchBuilder:
    config: BatchConfig
    stats: BatchStats = field(default_factory=BatchStats)
    _fields: dict[str, array[int]] = field(default_factory=dict)
    _scores: array[float] = field(default_factory=lambda: array("f"))
    _logprobs: array[float] | None = field(default_factory=lambda: array("f"))
    _drop: array[int] = field(default_factory=lambda: array("b"))
    _uid: list[str] = field(default_factory=list)
    _rollouts: list[str] = field(default_factory=list)
    _versions: list[str | None] = field(default_factory=list)
    _sources: list[list[tuple[str | None, int, int]]] = field(default_factory=list)

    def __post_init__(self) -> None:
        for name in ("prompts", "responses", "input_ids", "attention_mask", "position_ids", "response_mask"):
            self._fields[name] = array("q")

    def add(self, row: Row, rewards: RowRewards, *, uid: str, rollout_id: str) -> None:
        P, R, pad = self.config.max_prompt_length, self.config.max_response_length, self.config.pad_token_id
        st = self.stats
        prompt = row.prompt_ids
        drop = len(prompt) > P
        if drop:
            prompt = prompt[-P:]
            st.dropped_prompts += 1
        response, mask, logprobs = row.response_ids, row.response_mask, row.logprobs
        if len(response) > R:
            response, mask = response[:R], mask[:R]
            logprobs = None if logprobs is None else logprobs[:R]
            st.truncated_responses += 1
        n_p, n_r = len(prompt), len(response)
        left, right = P - n_p, R - n_r
        f = self._fields
        padded_prompt = array("q", [pad]) * left
        padded_prompt.extend(array("q", prompt))
        padded_response = array("q", response)
        padded_response.extend(array("q", [pad]) * right)
        f["prompts"].extend(padded_prompt)
        f["responses"].extend(padded_response)
        f["input_ids"].extend(padded_prompt)
        f["input_ids"].extend(padded_response)
        attention = array("q", [0]) * left + array("q", [1]) * (n_p + n_r) + array("q", [0]) * right
        f["attention_mask"].extend(attention)
        last = max(n_p + n_r - 1, 0)
        f["position_ids"].extend(array("q", [0]) * left)
        f["position_ids"].extend(array("q", range(n_p + n_r)))
        f["position_ids"].extend(array("q", [last]) * right)
        f["response_mask"].extend(array("q", mask))
        f["response_mask"].extend(array("q", [0]) * right)

        scores = array("f", bytes(4 * R))
        for index, value in rewards.steps:
            if index < n_r:
                scores[index] += value
            else:
                st.lost_step_rewards += 1
        if rewards.outcome is not None:
            if n_r:
                scores[n_r - 1] += rewards.outcome
            else:
                st.unplaced_rewards += 1
        self._scores.extend(scores)

        if self._logprobs is not None:
            if logprobs is None:
                self._logprobs = None
            else:
                self._logprobs.extend(logprobs)
                self._logprobs.extend(array("f", bytes(4 * right)))
        self._drop.append(1 if drop else 0)
        self._uid.append(uid)
        self._rollouts.append(rollout_id)
        self._versions.append(row.model_version)
        self._sources.append(
            [
                (sp.triplet.response_id, sp.start, min(sp.end, R))
                for sp in row.spans
                if sp.trained and sp.start < R
            ]
        )
        st.rows += 1
        st.prompt_tokens += n_p
        st.response_tokens += n_r
        st.trained_tokens += sum(mask)

    def build(self) -> Batch:
        f = self._fields
        one_version = len(set(self._versions)) <= 1
        return Batch(
            size=self.stats.rows,
            prompt_length=self.config.max_prompt_length,
            response_length=self.config.max_response_length,
            prompts=f["prompts"],
            responses=f["responses"],
            input_ids=f["input_ids"],
            attention_mask=f["attention_mask"],
            position_ids=f["position_ids"],
            response_mask=f["response_mask"],
            token_level_scores=self._scores,
            rollout_log_probs=self._logprobs if one_version and self.stats.rows else None,
            is_drop_mask=self._drop,
            uid=self._uid,
            rollout_ids=self._rollouts,
            model_versions=self._versions,
            sources=self._sources,
            stats=self.stats,
        )
