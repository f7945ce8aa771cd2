"""The learning demo's task: two-digit addition, self-written (no download), with a train split, a held-out
split, a scorer and the noisy teacher of the warm start.

The warm start imitates a teacher that is right only `right_rate` of the time: otherwise it answers with one of
the two numbers it was given. After it the policy knows the answer's format and can add, but answers with a
copied operand as often as with the sum; greedy accuracy is low while sampling still finds the sum. GRPO, with the
exact reward alone, is what moves the policy to the sum (pure RL from random weights does not learn at this size).
"""

from __future__ import annotations

import random
from dataclasses import dataclass

__all__ = ["Problem", "score", "splits", "teacher_answer"]


@dataclass(frozen=True, slots=True)
class Problem:
    a: int
    b: int

    @property
    def question(self) -> str:
        return f"{self.a}+{self.b}="

    @property
    def answer(self) -> str:
        return str(self.a + self.b)


def splits(seed: int = 0, held_out: int = 200) -> tuple[list[Problem], list[Problem]]:
    """Every pair of two-digit-or-less numbers, shuffled by `seed`: `held_out` of them never trained on."""
    pairs = [Problem(a, b) for a in range(100) for b in range(100)]
    random.Random(seed).shuffle(pairs)
    return pairs[held_out:], pairs[:held_out]


def teacher_answer(problem: Problem, rng: random.Random, right_rate: float = 0.3) -> str:
    """The warm start's target: the sum with probability `right_rate`, else one of the operands."""
    x = rng.random()
    if x < right_rate:
        return problem.answer
    return str(problem.a if x < right_rate + (1 - right_rate) / 2 else problem.b)


def score(text: str | None, answer: str) -> float:
    """1.0 for exactly the sum (surrounding whitespace aside), else 0.0."""
    return 1.0 if text is not None and text.strip() == answer else 0.0
