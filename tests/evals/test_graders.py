"""The graders on their own: a judge's verdict read from whatever text it answers, the
schema and call graders on the values a case's task gives them."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic_evals.evaluators import EvaluatorContext

from lodger.evals import MatchesSchema, ModelJudge, ToolCalled
from lodger.evals.graders import _verdict
from lodger.providers import register_function
from lodger.providers.base import ModelRequest


def context(output: Any, calls: list[dict[str, Any]] | None = None, expected: Any = None) -> Any:
    return EvaluatorContext(
        name="c",
        inputs="task",
        metadata=None,
        expected_output=expected,
        output=output,
        duration=0.0,
        _span_tree=None,  # type: ignore[arg-type]
        attributes={"calls": calls or []},
        metrics={},
    )


@pytest.mark.parametrize(
    ("text", "verdict"),
    [
        ('{"pass": true, "score": 0.8, "reason": "fine"}', (True, 0.8, "fine")),
        ('Sure! {"pass": false, "reason": "wrong"} hope that helps', (False, None, "wrong")),
        ('{"pass": "yes", "score": true}', (None, None, "")),  # not a bool, not a number
        ("PASS: it is right", (True, None, "PASS: it is right")),
        ("fail.", (False, None, "fail.")),
        ("I think so", (None, None, "I think so")),
        ("", (None, None, "")),
        ("}{", (None, None, "}{")),
    ],
)
def test_a_judge_verdict_is_read_from_any_answer(text: str, verdict: tuple[Any, ...]) -> None:
    assert _verdict(text) == verdict


async def test_the_judge_is_asked_with_the_rubric_and_what_it_may_see() -> None:
    seen: list[str] = []

    def judge(request: ModelRequest) -> str:
        seen.append(request.messages[-1].text)  # type: ignore[union-attr]
        return '{"pass": true, "score": 1, "reason": "ok"}'

    register_function("grader-judge", judge)
    grader = ModelJudge(rubric="be kind", model="function:grader-judge", include_expected=True)
    out = await grader.evaluate(context("hello", expected="hi"))
    assert isinstance(out, dict) and out["judge"].value is True and out["judge_score"].value == 1.0
    assert "Rubric: be kind" in seen[0] and "Expected answer: hi" in seen[0]
    assert "Task given to the agent: task" in seen[0] and "answer: hello" in seen[0]


def test_schema_and_call_graders() -> None:
    schema = MatchesSchema({"type": "object", "required": ["n"]})
    assert schema.evaluate(context('{"n": 1}')).value is True
    assert schema.evaluate(context({"n": 1})).value is True
    assert schema.evaluate(context("{}")).value is False
    assert schema.evaluate(context("not json")).reason.startswith("the answer is not JSON")
    calls = [{"tool": "read_file", "arguments": {"path": "a.txt", "limit": 5}}]
    assert ToolCalled("read_file", arguments={"path": "a.txt"}).evaluate(context("", calls)).value
    assert not ToolCalled("read_file", arguments={"path": "b"}).evaluate(context("", calls)).value
    assert not ToolCalled("read_file", called=False).evaluate(context("", calls)).value
    assert ToolCalled("shell", called=False).evaluate(context("", calls)).value
