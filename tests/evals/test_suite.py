"""Eval suites on real SQLite logs (and a file:// object store) with function models: 20
cases score as their definition says, each case runs on its own session with bounded
concurrency, its verdicts are facts on that session, and two runs compare side by side."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from lodger.errors import UsageError
from lodger.evals import (
    Case,
    Contains,
    Dataset,
    EvalSuite,
    ModelJudge,
    Start,
    ToolCalled,
    compare_runs,
    load_suites,
    run_suite,
)
from lodger.events import EvalScored
from lodger.providers import register_function
from lodger.providers.scripted import ScriptedModel
from lodger.runtime.sessions import Binding, Sessions
from lodger.storage import Storage

SAMPLE = Path(__file__).parent / "samples" / "arithmetic.py"
GRADERS = ["EqualsExpected", "called:add", "MatchesSchema", "judge"]


@pytest.fixture(params=["sqlite", "store"])
async def sessions(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Sessions]:
    if request.param == "sqlite":
        storage = Storage.local(tmp_path / "state")
    else:
        storage = Storage.from_url(f"file://{tmp_path / 'objects'}")
    async with Sessions(storage) as made:
        yield made


def sample() -> tuple[dict[str, EvalSuite], Any]:
    suites = load_suites(SAMPLE)
    module = __import__("lodger_evals_arithmetic")
    return {s.name: s for s in suites}, module


async def test_twenty_cases_score_as_defined_and_two_runs_compare(sessions: Sessions) -> None:
    suites, module = sample()
    module.RUNNING["most"] = 0
    first = await run_suite(suites["arith-v1"], sessions)
    assert 1 < module.RUNNING["most"] <= 3  # concurrent, never more than the bound
    module.RUNNING["most"] = 0
    second = await run_suite(suites["arith-v2"], sessions)
    assert module.RUNNING["most"] <= 3

    shortcut = {f"add-{a}-{b}" for a, b in module.PAIRS if a + b >= 10}
    assert 0 < len(shortcut) < 20
    assert len(first.cases) == len(second.cases) == 20
    assert (first.passed, first.failed) == (20, 0)
    assert (second.passed, second.failed) == (20 - len(shortcut), len(shortcut))
    for case in second.cases:
        wrong = case.name in shortcut
        assert case.assertions["EqualsExpected"][0] is not wrong
        assert case.assertions["called:add"][0] is not wrong
        assert case.assertions["MatchesSchema"][0] and case.assertions["judge"][0]
        assert case.scores["closeness"][0] == (0.5 if wrong else 1.0)
        assert case.scores["judge_score"][0] == 1.0
    as_json = second.to_dict()
    assert as_json["summary"]["scores"]["closeness"] == pytest.approx(
        (20 - len(shortcut) + 0.5 * len(shortcut)) / 20
    )

    # each case on a session of its own, its verdicts committed there
    session_ids = {c.session_id for c in (*first.cases, *second.cases)}
    assert len(session_ids) == 40 and None not in session_ids
    case = second.case(sorted(shortcut)[0])
    assert case.session_id is not None
    facts = [
        e.body
        for e in await sessions.storage.log.read_all(case.session_id)
        if isinstance(e.body, EvalScored)
    ]
    assert {f.eval_run for f in facts} == {second.eval_run}
    assert sorted(f.evaluator for f in facts if f.passed is not None) == sorted(GRADERS)
    assert {f.evaluator: f.score for f in facts if f.score is not None} == {
        "closeness": 0.5,
        "judge_score": 1.0,
    }
    assert [f.passed for f in facts if f.evaluator == "called:add"] == [False]

    comparison = compare_runs(first.to_dict(), as_json)
    assert comparison["summary"]["broke"] == len(shortcut)
    assert comparison["summary"]["fixed"] == 0
    broke = {row["name"] for row in comparison["cases"] if row["change"] == "broke"}
    assert broke == shortcut
    back = compare_runs(as_json, first.to_dict())
    assert back["summary"]["fixed"] == len(shortcut) and back["summary"]["broke"] == 0


async def test_a_case_starts_on_a_fork_of_a_recorded_session(sessions: Sessions) -> None:
    recorded = await sessions.run(
        "the code word is heron", binding=Binding(model=ScriptedModel([{"text": "noted"}]))
    )

    def recall(request: Any) -> str:
        said = [getattr(m, "text", "") for m in request.messages]
        return "heron" if any("heron" in s for s in said[:-1]) else "no idea"

    register_function("recall", recall)
    suite = EvalSuite(
        name="memory",
        dataset=Dataset(
            name="memory",
            cases=[
                Case(
                    name="forked",
                    inputs=Start(input="what was the code word?", session=recorded.session_id),
                    evaluators=[Contains("heron"), ToolCalled("add", called=False)],
                ),
                Case(
                    name="fresh", inputs="what was the code word?", evaluators=[Contains("heron")]
                ),
            ],
        ),
        binding=Binding(model="function:recall"),
    )
    run = await run_suite(suite, sessions)
    assert run.case("forked").passed(None) and not run.case("fresh").passed(None)
    forked = run.case("forked").session_id
    assert forked is not None
    first = (await sessions.storage.log.read_all(forked))[0].body
    assert first.parent.session_id == recorded.session_id
    # the source session itself is untouched
    assert all(
        not isinstance(e.body, EvalScored)
        for e in await sessions.storage.log.read_all(recorded.session_id)
    )


async def test_a_judge_that_gives_no_verdict_fails_the_case(sessions: Sessions) -> None:
    register_function("mumble", lambda request: "hmm, hard to say")
    register_function("answer", lambda request: "42")
    suite = EvalSuite(
        name="judged",
        dataset=Dataset(
            name="judged",
            cases=[Case(name="one", inputs="?")],
            evaluators=[ModelJudge(rubric="is it right", model="function:mumble")],
        ),
        binding=Binding(model="function:answer"),
    )
    run = await run_suite(suite, sessions)
    ok, reason = run.case("one").assertions["judge"]
    assert not ok and "no verdict" in reason


def test_a_suite_needs_named_cases_and_a_positive_concurrency() -> None:
    unnamed = Dataset(name="d", cases=[Case(inputs="x")])
    with pytest.raises(UsageError, match="without a name"):
        EvalSuite(name="s", dataset=unnamed, binding=Binding(model="test"))
    named = Dataset(name="d", cases=[Case(name="a", inputs="x")])
    with pytest.raises(UsageError, match="concurrency"):
        EvalSuite(name="s", dataset=named, binding=Binding(model="test"), concurrency=0)


async def test_a_turn_that_raises_fails_its_case_and_keeps_its_session(
    sessions: Sessions,
) -> None:
    def broken(request: Any) -> str:
        raise RuntimeError("model broke")

    register_function("broken", broken)
    cases = [
        Case(name="broken", inputs="hi", evaluators=[ToolCalled("add", called=False)]),
    ]
    suite = EvalSuite(
        name="errors",
        dataset=Dataset(name="errors", cases=cases),
        binding=Binding(model="function:broken"),
    )
    run = await run_suite(suite, sessions)
    case = run.case("broken")
    assert not case.passed(None) and case.status == "error"
    assert case.error is not None and "RuntimeError: model broke" in case.error
    assert case.session_id is not None
    events = await sessions.storage.log.read_all(case.session_id)
    assert events[0].kind == "session_started"
    assert [e.body.evaluator for e in events if isinstance(e.body, EvalScored)] == [
        "not_called:add"
    ]
    assert run.to_dict()["summary"]["failed"] == 1
