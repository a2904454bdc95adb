"""An eval suite: a pydantic-evals ``Dataset`` of cases run as lodger turns.

Each case runs as one turn on a session of its own: a new session, or a copy-free fork of
a starting session at an offset (``Start(input, session=..., at=...)``). The cases run
with bounded concurrency (``EvalSuite.concurrency``: pydantic-evals' ``max_concurrency``);
the graders (``lodger.evals.graders`` and any pydantic-evals evaluator) score each one,
and every verdict is kept twice: as ``eval_scored`` facts on the case's session (one per
grader result, all in one append) and in the run's report (``EvalRun.to_dict``, the JSON
``lodger eval`` writes). ``compare_runs`` puts two reports side by side.

>>> suite = EvalSuite(name="support", dataset=dataset, binding=Binding(model="function:bot"))
>>> run = await run_suite(suite, sessions)
>>> run.passed, run.failed
(19, 1)
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from lodger._core.extras import require
from lodger.engine.journal import Journal
from lodger.errors import UsageError
from lodger.events import EvalScored, ToolDispatched
from lodger.runtime.sessions import Binding, Sessions

with require("evals", "lodger's evals"):
    from pydantic_evals import Dataset, increment_eval_metric, set_eval_attribute
    from pydantic_evals.reporting import EvaluationReport, ReportCase

__all__ = ["EvalRun", "EvalSuite", "Start", "compare_runs", "run_suite"]


@dataclass(frozen=True, kw_only=True)
class Start:
    """A case's input, and where it starts: a fork of ``session`` at offset ``at`` (its
    whole log when None), or a new session when ``session`` is None."""

    input: str
    session: str | None = None
    at: int | None = None

    def __str__(self) -> str:
        return self.input


@dataclass(frozen=True, kw_only=True)
class EvalSuite:
    """Cases (a pydantic-evals ``Dataset`` whose inputs are strings or ``Start``), the
    agent they run on (a ``Binding``: model, tools, workspace, limits), how many run at
    once, and ``min_score``: a case with a score below it fails (None: scores never
    fail a case; assertions always do)."""

    name: str
    dataset: Dataset[Any, Any, Any]
    binding: Binding
    concurrency: int = 4
    min_score: float | None = None

    def __post_init__(self) -> None:
        if self.concurrency < 1:
            raise UsageError(
                f"suite {self.name!r} has concurrency {self.concurrency}",
                hint="run at least 1 case at once",
                code="usage",
            )
        names = [case.name for case in self.dataset.cases]
        if None in names or len(set(names)) != len(names):
            raise UsageError(
                f"suite {self.name!r} has a case without a name, or two of one name",
                hint="name each Case: its verdicts and its test are found by name",
                code="usage",
            )


@dataclass(frozen=True, kw_only=True)
class CaseResult:
    """One case's outcome: its session, how its turn ended, its answer, its verdicts."""

    name: str
    session_id: str | None
    status: str
    output: Any
    expected_output: Any
    assertions: dict[str, tuple[bool, str]]
    scores: dict[str, tuple[float, str]]
    labels: dict[str, tuple[str, str]]
    error: str | None = None

    def passed(self, min_score: float | None) -> bool:
        if self.error is not None or not all(ok for ok, _ in self.assertions.values()):
            return False
        return min_score is None or all(v >= min_score for v, _ in self.scores.values())

    def to_dict(self, min_score: float | None) -> dict[str, Any]:
        return {
            "name": self.name,
            "session_id": self.session_id,
            "status": self.status,
            "passed": self.passed(min_score),
            "output": _jsonable(self.output),
            "expected_output": _jsonable(self.expected_output),
            "assertions": {k: {"value": v, "reason": r} for k, (v, r) in self.assertions.items()},
            "scores": {k: {"value": v, "reason": r} for k, (v, r) in self.scores.items()},
            "labels": {k: {"value": v, "reason": r} for k, (v, r) in self.labels.items()},
            "error": self.error,
        }


def _jsonable(value: Any) -> Any:
    if value is None or isinstance(value, str | int | float | bool | list | dict):
        return value
    dump = getattr(value, "model_dump", None)
    return dump(mode="json") if callable(dump) else str(value)


@dataclass(frozen=True, kw_only=True)
class EvalRun:
    """A suite's run: its id (the ``eval_run`` of its facts), the cases, pydantic-evals'
    report (``report.render()`` prints its own table; ``baseline=`` compares)."""

    eval_run: str
    suite: str
    model: str
    min_score: float | None
    cases: tuple[CaseResult, ...]
    report: EvaluationReport[Any, Any, Any] = field(repr=False)

    @property
    def passed(self) -> int:
        return sum(c.passed(self.min_score) for c in self.cases)

    @property
    def failed(self) -> int:
        return len(self.cases) - self.passed

    def case(self, name: str) -> CaseResult:
        return next(c for c in self.cases if c.name == name)

    def to_dict(self) -> dict[str, Any]:
        scores: dict[str, list[float]] = {}
        for c in self.cases:
            for name, (value, _) in c.scores.items():
                scores.setdefault(name, []).append(value)
        return {
            "eval_run": self.eval_run,
            "suite": self.suite,
            "model": self.model,
            "min_score": self.min_score,
            "summary": {
                "cases": len(self.cases),
                "passed": self.passed,
                "failed": self.failed,
                "scores": {k: sum(v) / len(v) for k, v in sorted(scores.items())},
            },
            "cases": [c.to_dict(self.min_score) for c in self.cases],
        }


def _model_spec(binding: Binding) -> str:
    return binding.model if isinstance(binding.model, str) else binding.model.spec


async def _run_case(sessions: Sessions, binding: Binding, inputs: Any) -> Any:
    start = inputs if isinstance(inputs, Start) else Start(input=str(inputs))
    session_id = sessions.ids.new_id()
    if start.session is not None:
        await sessions.fork(start.session, at=start.at, session=session_id)
    set_eval_attribute("session_id", session_id)
    try:
        result = await sessions.run(start.input, binding=binding, session=session_id)
    except Exception as exc:  # noqa: BLE001 - the agent's code (a model function) failed the turn
        # kept as the case's outcome, with its session, rather than lost as a task failure
        set_eval_attribute("status", "error")
        set_eval_attribute("error", f"{type(exc).__name__}: {exc}")
        return None
    calls: list[dict[str, Any]] = [
        {"tool": e.body.tool, "arguments": e.body.arguments}
        for e in await sessions.storage.log.read_all(session_id)
        if isinstance(e.body, ToolDispatched)
    ]
    set_eval_attribute("status", result.status)
    set_eval_attribute("calls", calls)
    increment_eval_metric("requests", len(result.usage.requests))
    increment_eval_metric("input_tokens", result.usage.input_tokens)
    increment_eval_metric("output_tokens", result.usage.output_tokens)
    return result.output if result.output is not None else result.answer


def _case_result(case: ReportCase[Any, Any, Any]) -> CaseResult:
    return CaseResult(
        name=case.name,
        session_id=case.attributes.get("session_id"),
        status=str(case.attributes.get("status", "")),
        output=case.output,
        expected_output=case.expected_output,
        assertions={k: (bool(v.value), v.reason or "") for k, v in case.assertions.items()},
        scores={k: (float(v.value), v.reason or "") for k, v in case.scores.items()},
        labels={k: (str(v.value), v.reason or "") for k, v in case.labels.items()},
        error="; ".join(
            [
                *([str(case.attributes["error"])] if "error" in case.attributes else []),
                *(f.error_message for f in case.evaluator_failures),
            ]
        )
        or None,
    )


def _facts(eval_run: str, case: CaseResult) -> list[EvalScored]:
    facts = [
        EvalScored(eval_run=eval_run, case=case.name, evaluator=k, passed=v, reason=r)
        for k, (v, r) in case.assertions.items()
    ]
    facts += [
        EvalScored(eval_run=eval_run, case=case.name, evaluator=k, score=v, reason=r)
        for k, (v, r) in case.scores.items()
    ]
    facts += [
        EvalScored(eval_run=eval_run, case=case.name, evaluator=k, reason=f"{v}: {r}" if r else v)
        for k, (v, r) in case.labels.items()
    ]
    return facts


async def _record(sessions: Sessions, eval_run: str, cases: Sequence[CaseResult]) -> None:
    """Each case's verdicts as ``eval_scored`` facts on its session, in one append."""
    for case in cases:
        facts = _facts(eval_run, case)
        if case.session_id is None or not facts:
            continue
        async with sessions.open_session(case.session_id) as (writer, state):
            journal = Journal(writer, state, clock=sessions.clock, ids=sessions.ids)
            await journal.record(*(journal.draft(f) for f in facts))


async def run_suite(
    suite: EvalSuite, sessions: Sessions, *, eval_run: str | None = None
) -> EvalRun:
    """Run every case of ``suite`` on ``sessions`` (at most ``suite.concurrency`` at once),
    grade them, record the verdicts on the cases' sessions, and return the run."""
    run_id = eval_run or sessions.ids.new_id()

    async def task(inputs: Any) -> Any:
        return await _run_case(sessions, suite.binding, inputs)

    report = await suite.dataset.evaluate(
        task, name=suite.name, max_concurrency=suite.concurrency, progress=False
    )
    cases = [_case_result(c) for c in report.cases]
    cases += [
        CaseResult(
            name=f.name,
            session_id=None,
            status="error",
            output=None,
            expected_output=f.expected_output,
            assertions={},
            scores={},
            labels={},
            error=f.error_message,
        )
        for f in report.failures
    ]
    order = {c.name: n for n, c in enumerate(suite.dataset.cases)}
    cases.sort(key=lambda c: order.get(c.name, len(order)))
    await _record(sessions, run_id, cases)
    return EvalRun(
        eval_run=run_id,
        suite=suite.name,
        model=_model_spec(suite.binding),
        min_score=suite.min_score,
        cases=tuple(cases),
        report=report,
    )


def compare_runs(baseline: dict[str, Any], current: dict[str, Any]) -> dict[str, Any]:
    """Two runs' reports (``EvalRun.to_dict``, or the JSON ``lodger eval`` wrote) side by
    side: each case's pass and scores in both, and what changed (``fixed``, ``broke``,
    ``same``; ``added`` or ``removed`` for a case only one of them has)."""
    before = {c["name"]: c for c in baseline["cases"]}
    after = {c["name"]: c for c in current["cases"]}
    rows = []
    for name in [*before, *(n for n in after if n not in before)]:
        old, new = before.get(name), after.get(name)
        if old is None or new is None:
            change = "added" if old is None else "removed"
        elif old["passed"] == new["passed"]:
            change = "same"
        else:
            change = "fixed" if new["passed"] else "broke"
        rows.append(
            {
                "name": name,
                "change": change,
                "baseline": _side(old),
                "current": _side(new),
            }
        )
    return {
        "baseline": {"eval_run": baseline["eval_run"], "model": baseline["model"]},
        "current": {"eval_run": current["eval_run"], "model": current["model"]},
        "summary": {
            "baseline": baseline["summary"],
            "current": current["summary"],
            "fixed": sum(r["change"] == "fixed" for r in rows),
            "broke": sum(r["change"] == "broke" for r in rows),
        },
        "cases": rows,
    }


def _side(case: dict[str, Any] | None) -> dict[str, Any] | None:
    if case is None:
        return None
    return {
        "passed": case["passed"],
        "scores": {k: v["value"] for k, v in case["scores"].items()},
        "output": case["output"],
    }
