"""A math tutor for the mock vLLM: answers GSM8K-style questions in GSM8K's format, right or wrong by seed.

The mock cannot do arithmetic from prose, so it is given the problems with their answers (GSM8K JSONL: one
`{"question": ..., "answer": "... #### N"}` per line). For a request whose last user message contains a known
question it writes a short worked answer ending in `#### N`; the k-th time it sees the same question the answer is
wrong (off by one, or more) when `wrong(seed, question, k)` says so. The rule is public on purpose — demos get a
believable mix of right and wrong answers, and a test can know exactly which answers were wrong without trusting
the mock: the count of wrong answers per question does not depend on the order in which requests arrive.
Unknown questions get `I don't know. #### 0`.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections import Counter
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from agl_lite.testing.mock_vllm.scenario import Scenario, last_user_text

__all__ = ["MathTutor", "final_answer", "load_problems", "wrong"]

_FINAL = re.compile(r"####\s*(-?[\d,]*\.?\d+)")


def final_answer(text: str) -> str | None:
    """The number after GSM8K's `####` marker, commas removed; None when there is none."""
    m = _FINAL.search(text)
    return m.group(1).replace(",", "") if m else None


def wrong(seed: int, question: str, k: int, rate: float) -> bool:
    """Whether the k-th (0-based) answer to `question` is wrong: a hash of (seed, question, k) below `rate`."""
    digest = hashlib.sha256(f"{seed}\x00{question}\x00{k}".encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64 < rate


def load_problems(lines: Iterable[str]) -> dict[str, str]:
    """question → final answer, from GSM8K JSONL lines (blank lines skipped)."""
    out: dict[str, str] = {}
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
            question, answer = str(row["question"]).strip(), final_answer(str(row["answer"]))
        except (ValueError, KeyError, TypeError) as exc:
            raise ValueError(f"line {n}: not a GSM8K problem ({exc!r})") from exc
        if answer is None:
            raise ValueError(f"line {n}: the answer has no '#### N' final answer")
        out[question] = answer
    return out


class MathTutor:
    """A `MockVLLM` hook: `MockVLLM(..., hook=MathTutor.from_file(path, seed=1, wrong_rate=0.3))`."""

    def __init__(self, problems: Mapping[str, str], *, seed: int = 0, wrong_rate: float = 0.0) -> None:
        if not 0.0 <= wrong_rate <= 1.0:
            raise ValueError("wrong_rate must be between 0 and 1")
        self.problems = dict(problems)
        self.seed = seed
        self.wrong_rate = wrong_rate
        self.asked: Counter[str] = Counter()
        # Longest first, so that a question that contains another is matched as itself.
        self._by_length = sorted(self.problems, key=len, reverse=True)

    @classmethod
    def from_file(cls, path: str | Path, *, seed: int = 0, wrong_rate: float = 0.0) -> MathTutor:
        with open(path, encoding="utf-8") as f:
            return cls(load_problems(f), seed=seed, wrong_rate=wrong_rate)

    def __call__(self, request: dict[str, Any]) -> Scenario | None:
        text = last_user_text(request)
        question = next((q for q in self._by_length if q in text), None)
        if question is None:
            return Scenario(content="I don't know.\n#### 0")
        k = self.asked[question]
        self.asked[question] += 1
        answer = self.problems[question]
        if wrong(self.seed, question, k, self.wrong_rate):
            answer = _off_by_some(answer, k)
        return Scenario(
            content=f"Let me work through it step by step.\nThe result is {answer}.\n#### {answer}"
        )


def _off_by_some(answer: str, k: int) -> str:
    """A wrong answer of the same shape: the number plus 1 + k % 3 (integers stay integers)."""
    delta = 1 + k % 3
    if "." in answer:
        return f"{float(answer) + delta:g}"
    return str(int(answer) + delta)
