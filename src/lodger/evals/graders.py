"""Graders for lodger eval cases: pydantic-evals evaluators that read what a case's session
did (its calls) as well as what it answered.

Deterministic: ``Equals``, ``EqualsExpected`` and ``Contains`` (pydantic-evals' own),
``MatchesSchema`` (the answer, parsed as JSON, against a JSON schema), ``Check`` (a Python
function of the context), ``ToolCalled`` (a tool was, or was not, called). Model-judged:
``ModelJudge`` asks a lodger model (any spec ``make_model`` reads, ``function:NAME`` in
tests) whether the answer meets a rubric.

A case's task (``lodger.evals.suite``) sets these attributes for the graders:
``session_id``, ``status`` (how the turn ended) and ``calls`` (each dispatched call's
``tool`` and ``arguments``, in log order).

>>> Case(name="reads", inputs="what is in a.txt?", evaluators=[ToolCalled("read_file")])
"""

from __future__ import annotations

import inspect
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from lodger._core.extras import require

with require("evals", "lodger's evals"):
    from pydantic_evals.evaluators import (
        Contains,
        Equals,
        EqualsExpected,
        EvaluationReason,
        Evaluator,
        EvaluatorContext,
        EvaluatorOutput,
    )

__all__ = [
    "Check",
    "Contains",
    "Equals",
    "EqualsExpected",
    "MatchesSchema",
    "ModelJudge",
    "ToolCalled",
    "calls_of",
]


def calls_of(ctx: EvaluatorContext[Any, Any, Any]) -> list[dict[str, Any]]:
    """The calls the case's session dispatched (``tool`` and ``arguments`` each)."""
    calls = ctx.attributes.get("calls", [])
    return list(calls) if isinstance(calls, list) else []


@dataclass(repr=False)
class ToolCalled(Evaluator[Any, Any, Any]):
    """The case called ``tool`` (``called=False``: never called it); ``arguments``, when
    given, must be a subset of one call's arguments."""

    tool: str
    called: bool = True
    arguments: dict[str, Any] | None = None

    def get_default_evaluation_name(self) -> str:
        return f"{'called' if self.called else 'not_called'}:{self.tool}"

    def evaluate(self, ctx: EvaluatorContext[Any, Any, Any]) -> EvaluationReason:
        wanted = self.arguments or {}
        matching = [
            c
            for c in calls_of(ctx)
            if c.get("tool") == self.tool
            and all(c.get("arguments", {}).get(k) == v for k, v in wanted.items())
        ]
        seen = sorted({str(c.get("tool")) for c in calls_of(ctx)})
        if self.called:
            why = f"{len(matching)} matching call(s)" if matching else f"called only {seen}"
            return EvaluationReason(bool(matching), reason=why)
        why = f"called {len(matching)} time(s)" if matching else "never called"
        return EvaluationReason(not matching, reason=why)


@dataclass(repr=False)
class MatchesSchema(Evaluator[Any, Any, Any]):
    """The answer is JSON (or already a value) that the JSON ``schema`` accepts."""

    schema: dict[str, Any]

    def evaluate(self, ctx: EvaluatorContext[Any, Any, Any]) -> EvaluationReason:
        import jsonschema

        value = ctx.output
        if isinstance(value, str):
            try:
                value = json.loads(value)
            except ValueError as exc:
                return EvaluationReason(False, reason=f"the answer is not JSON: {exc}")
        errors = sorted(jsonschema.Draft202012Validator(self.schema).iter_errors(value), key=str)
        if errors:
            return EvaluationReason(False, reason=errors[0].message)
        return EvaluationReason(True)


CheckFunction = Callable[[EvaluatorContext[Any, Any, Any]], Any]


@dataclass(repr=False)
class Check(Evaluator[Any, Any, Any]):
    """A Python function of the context (sync or async) as a grader: it returns a bool
    (pass/fail), a number (a score), a string (a label), or an ``EvaluationReason``."""

    fn: CheckFunction
    name: str = ""

    def get_default_evaluation_name(self) -> str:
        return self.name or getattr(self.fn, "__name__", "check")

    async def evaluate(self, ctx: EvaluatorContext[Any, Any, Any]) -> EvaluatorOutput:
        result = self.fn(ctx)
        if inspect.isawaitable(result):
            result = await result
        out: EvaluatorOutput = result
        return out


JUDGE_SYSTEM = (
    "You grade an AI agent's answer against a rubric. Reply with one JSON object and "
    'nothing else: {"pass": true or false, "score": a number from 0 to 1, "reason": '
    '"one sentence"}.'
)


def _judge_prompt(judge: ModelJudge, ctx: EvaluatorContext[Any, Any, Any]) -> str:
    parts = [f"Rubric: {judge.rubric}"]
    if judge.include_input:
        parts.append(f"Task given to the agent: {ctx.inputs}")
    if judge.include_expected and ctx.expected_output is not None:
        parts.append(f"Expected answer: {ctx.expected_output}")
    parts.append(f"The agent's answer: {ctx.output}")
    return "\n\n".join(parts)


def _verdict(text: str) -> tuple[bool | None, float | None, str]:
    start, end = text.find("{"), text.rfind("}")
    try:
        raw = json.loads(text[start : end + 1]) if 0 <= start < end else None
    except ValueError:
        raw = None
    if not isinstance(raw, dict):
        word = text.strip().split(maxsplit=1)
        head = word[0].strip(".:").upper() if word else ""
        passed = True if head == "PASS" else False if head == "FAIL" else None
        return passed, None, text.strip()[:500]
    passed = raw.get("pass")
    score = raw.get("score")
    return (
        passed if isinstance(passed, bool) else None,
        float(score) if isinstance(score, int | float) and not isinstance(score, bool) else None,
        str(raw.get("reason", ""))[:500],
    )


@dataclass(repr=False)
class ModelJudge(Evaluator[Any, Any, Any]):
    """A model judges the answer against ``rubric``: ``model`` is a lodger model spec
    (``openai:gpt-4.1``, ``function:judge`` for a registered function). The judge answers
    ``{"pass": ..., "score": ..., "reason": ...}`` (or a leading PASS/FAIL): the pass is
    an assertion named by the evaluator, the score (when given) ``<name>_score``."""

    rubric: str
    model: str
    include_input: bool = True
    include_expected: bool = False
    name: str = field(default="judge")

    def get_default_evaluation_name(self) -> str:
        return self.name

    async def evaluate(self, ctx: EvaluatorContext[Any, Any, Any]) -> EvaluatorOutput:
        from lodger.providers import make_model
        from lodger.providers.base import ModelRequest, UserMessage

        model = make_model(self.model)
        try:
            response = await model.complete(
                ModelRequest(
                    system=JUDGE_SYSTEM,
                    messages=[UserMessage(text=_judge_prompt(self, ctx))],
                )
            )
        finally:
            await model.aclose()
        passed, score, reason = _verdict(response.text)
        if passed is None:
            return EvaluationReason(False, reason=f"the judge gave no verdict: {reason}")
        out: dict[str, EvaluationReason] = {self.name: EvaluationReason(passed, reason=reason)}
        if score is not None:
            out[f"{self.name}_score"] = EvaluationReason(score, reason=reason)
        return out
