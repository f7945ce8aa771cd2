"""The mock's math tutor: GSM8K answers, wrong exactly where the public rule says, and clear errors on bad data."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from openai import AsyncOpenAI

from agl_lite.testing.mock_vllm import MockVLLM, running_mock
from agl_lite.testing.mock_vllm.math_tutor import MathTutor, final_answer, load_problems, wrong

PROBLEMS = {"What is 2 plus 3?": "5", "A box holds 24 pencils. How many are in 9 boxes?": "216"}


def _ask(tutor: MathTutor, question: str) -> str:
    scenario = tutor({"messages": [{"role": "user", "content": f"Solve: {question}"}]})
    assert scenario is not None
    text = scenario.reply_text({})
    assert text is not None
    return text


def test_answers_follow_the_seeded_rule_per_question_and_occurrence() -> None:
    tutor = MathTutor(PROBLEMS, seed=3, wrong_rate=0.5)
    for question, answer in PROBLEMS.items():
        for k in range(20):
            got = final_answer(_ask(tutor, question))
            assert (got != answer) == wrong(3, question, k, 0.5)
    assert tutor.asked == {q: 20 for q in PROBLEMS}


@pytest.mark.parametrize(("rate", "expect_wrong"), [(0.0, False), (1.0, True)])
def test_the_rate_bounds_are_exact(rate: float, expect_wrong: bool) -> None:
    tutor = MathTutor(PROBLEMS, wrong_rate=rate)
    assert all((final_answer(_ask(tutor, "What is 2 plus 3?")) != "5") is expect_wrong for _ in range(10))


def test_an_unknown_question_is_answered_without_a_number() -> None:
    assert final_answer(_ask(MathTutor(PROBLEMS), "What is the capital of France?")) == "0"


def test_final_answer_reads_gsm8k_markers() -> None:
    assert final_answer("so 1,234 in all\n#### 1,234") == "1234"
    assert final_answer("#### -7") == "-7"
    assert final_answer("no marker 42") is None


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ('{"question": "q"}', "not a GSM8K problem"),
        ('{"question": "q", "answer": "no number"}', "has no '#### N'"),
        ("not json", "not a GSM8K problem"),
    ],
)
def test_bad_problem_files_say_which_line(line: str, message: str) -> None:
    with pytest.raises(ValueError, match=f"line 2: .*{message}"):
        load_problems(['{"question": "ok", "answer": "#### 1"}', line])


def test_wrong_rate_outside_0_1_is_refused() -> None:
    with pytest.raises(ValueError, match="between 0 and 1"):
        MathTutor(PROBLEMS, wrong_rate=1.5)


async def test_through_the_mock_server_with_the_openai_sdk(tmp_path: Path) -> None:
    path = tmp_path / "p.jsonl"
    path.write_text(
        "".join(json.dumps({"question": q, "answer": f"#### {a}"}) + "\n" for q, a in PROBLEMS.items())
    )
    mock = MockVLLM(("smollm2",), hook=MathTutor.from_file(path, seed=1, wrong_rate=0.0))
    async with running_mock(mock) as base_url:
        client = AsyncOpenAI(base_url=base_url, api_key="x")
        reply = await client.chat.completions.create(
            model="smollm2", messages=[{"role": "user", "content": "What is 2 plus 3?"}]
        )
        await client.close()
    assert final_answer(reply.choices[0].message.content or "") == "5"
