"""Long-running calls (issue 33 part 3) against a real HTTP build farm on loopback: the
tool answers ``Accepted(handle)``, the engine commits ``call_accepted`` after T1 and
before the model sees anything, and the polled result becomes the call's T2: in the same
step (``wait``), between steps or at a later turn's start (``continue``), shown to the
model as a runtime note when it had already read that the call was running."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from tests.tools.idempotent_server import serve
from tests.tools.remote_tools import build_tool, note

from lodger.context import Projector, project_messages
from lodger.engine import longcalls
from lodger.engine.checkpoint import decode_or_why, encode_checkpoint
from lodger.engine.settings import Services
from lodger.engine.state import SessionState
from lodger.events import CallAccepted, Event, ToolDispatched, ToolResponded
from lodger.ids import ManualClock, SequentialIds
from lodger.providers.base import ModelRequest, ToolResultMessage, UserMessage
from lodger.providers.scripted import ScriptedModel
from lodger.recovery import plan_recovery
from lodger.runtime.agent import Agent
from lodger.storage import EventLog, SqliteLogStore, Storage
from lodger.testing import MemoryArtifactStore
from lodger.tools import Tool

BUILD = {"calls": [{"name": "build", "args": {"target": "app"}}]}
NOTE = {"calls": [{"name": "note", "args": {"text": "meanwhile"}}]}


@pytest.fixture
def every_step(monkeypatch: pytest.MonkeyPatch) -> None:
    """No spacing between polls: a running call is polled before every step."""
    monkeypatch.setattr(longcalls, "_SPACING", (0.0, 0.0))


def agent(tmp_path: Path, tools: list[Tool], seen: list[ModelRequest], **kw: Any) -> Agent:
    model = ScriptedModel(kw.pop("script", None), **kw)
    inner = model.complete

    async def complete(request: ModelRequest, *, on_text: Any = None) -> Any:
        seen.append(request)
        return await inner(request, on_text=on_text)

    model.complete = complete  # type: ignore[method-assign]
    return Agent(
        model=model,
        tools=tools,
        storage=Storage(
            log=EventLog(SqliteLogStore(tmp_path / "state")), artifacts=MemoryArtifactStore()
        ),
        services=Services(clock=ManualClock(tick_us=10), ids=SequentialIds("a")),
    )


async def events_of(tmp_path: Path) -> list[Event]:
    log = EventLog(SqliteLogStore(tmp_path / "state"))
    try:
        return await log.read_all("s1")
    finally:
        await log.close()


def kinds(events: list[Event], call_id: str) -> list[str]:
    return [e.kind for e in events if e.call_id == call_id and e.kind != "model_output"]


def results(request: ModelRequest) -> list[str]:
    return [m.content for m in request.messages if isinstance(m, ToolResultMessage)]


def notes(request: ModelRequest) -> list[str]:
    return [
        m.text for m in request.messages if isinstance(m, UserMessage) and m.source == "runtime"
    ]


async def test_wait_polls_until_the_result_and_the_model_reads_only_the_result(
    tmp_path: Path,
) -> None:
    seen: list[ModelRequest] = []
    with serve() as (base, ledger):
        ledger.finish_at = 3  # running, running, done
        a = agent(tmp_path, [build_tool(base, "wait")], seen, script=[BUILD, {"text": "built"}])
        result = await a.run("build the app", session="s1")
        await a.close()
    assert result.status == "completed"
    assert ledger.polls == ["job-1"] * 3 and len(ledger.executed) == 1
    events = await events_of(tmp_path)
    assert kinds(events, "call-0-1") == ["tool_dispatched", "call_accepted", "tool_responded"]
    accepted = next(e.body for e in events if isinstance(e.body, CallAccepted))
    assert accepted.handle == {"job": "job-1"} and accepted.wait == "wait"
    assert results(seen[1]) == ["build finished: job-1 built"]  # no "running" shown
    assert notes(seen[1]) == []


async def test_continue_tells_the_model_it_runs_and_delivers_the_result_between_steps(
    tmp_path: Path, every_step: None
) -> None:
    seen: list[ModelRequest] = []
    with serve() as (base, ledger):
        ledger.finish_at = 2  # polled before step 2 (running), before step 3 (done)
        script = [BUILD, NOTE, {"text": "all done"}]
        a = agent(tmp_path, [build_tool(base), note], seen, script=script)
        result = await a.run("build, then note", session="s1")
        await a.close()
    assert result.status == "completed" and result.answer == "all done"
    running = results(seen[1])
    assert len(running) == 1 and '"status": "running"' in running[0]
    assert '"job": "job-1"' in running[0]
    # the result that came later: the shown tool result stays, the outcome is a note
    assert results(seen[2])[0] == running[0]
    assert notes(seen[2]) == [
        "The long-running call call-0-1 (build) finished: build finished: job-1 built"
    ]
    events = await events_of(tmp_path)
    t2 = [e for e in events if isinstance(e.body, ToolResponded) and e.call_id == "call-0-1"]
    assert len(t2) == 1 and t2[0].body.content == "build finished: job-1 built"
    assert len(ledger.executed) == 1


async def test_a_result_that_comes_after_the_turn_is_read_at_the_next_turns_start(
    tmp_path: Path,
) -> None:
    seen: list[ModelRequest] = []
    with serve() as (base, ledger):
        turns = [[BUILD, {"text": "started"}], [{"text": "saw it"}]]
        a = agent(tmp_path, [build_tool(base)], seen, turns=turns)
        first = await a.run("start a build", session="s1")
        assert first.status == "completed"
        events = await events_of(tmp_path)
        assert kinds(events, "call-0-1") == ["tool_dispatched", "call_accepted"]
        assert plan_recovery(events).turn_id is None  # the turn ended; the call runs on
        ledger.jobs["job-1"] = "done at last"
        second = await a.run("anything new?", session="s1")
        await a.close()
    assert second.status == "completed"
    assert notes(seen[-1]) == [
        "The long-running call call-0-1 (build) finished: build finished: done at last"
    ]
    events = await events_of(tmp_path)
    t2 = next(e for e in events if isinstance(e.body, ToolResponded))
    turn_two = next(e.turn_id for e in events if e.kind == "turn_started" and e.offset > 5)
    assert t2.turn_id == turn_two  # committed in the later turn
    assert sum(isinstance(e.body, ToolDispatched) for e in events) == 1


async def test_a_tool_that_accepts_without_a_poll_gets_an_error_result(tmp_path: Path) -> None:
    seen: list[ModelRequest] = []
    with serve() as (base, ledger):
        broken = build_tool(base).with_options(poll=None)
        a = agent(tmp_path, [broken], seen, script=[BUILD, {"text": "ok"}])
        await a.run("build", session="s1")
        await a.close()
    assert "declares no poll" in results(seen[1])[0]
    events = await events_of(tmp_path)
    assert not any(isinstance(e.body, CallAccepted) for e in events)
    del ledger


async def test_every_prefix_projects_and_checkpoints_like_a_full_fold(
    tmp_path: Path, every_step: None
) -> None:
    """The incremental projection equals ``project_messages`` at every prefix of a log
    with a running call and its late result, and a fold checkpointed at any offset
    (``call_accepted`` included) folds the rest like the whole log."""
    seen: list[ModelRequest] = []
    with serve() as (base, ledger):
        ledger.finish_at = 2
        a = agent(tmp_path, [build_tool(base), note], seen, script=[BUILD, NOTE, {"text": "ok"}])
        await a.run("build, then note", session="s1")
        await a.close()
    log = EventLog(SqliteLogStore(tmp_path / "state"))
    try:
        verified = await log.read_verified("s1")
    finally:
        await log.close()
    events = verified.decode()
    whole = SessionState("s1", events)
    grown: list[Event] = []
    incremental = Projector(grown)
    running_at: list[int] = []
    for n, e in enumerate(events, start=1):
        grown.append(e)
        expected = project_messages(events[:n])
        assert list(incremental.project().messages) == list(expected.messages), n
        prefix = SessionState("s1", events[:n])
        restored = decode_or_why(encode_checkpoint(prefix, verified.chain), verified)
        assert not isinstance(restored, str), restored
        running = [c.call_id for c in restored.accepted_open.values()]
        assert running == [c.call_id for c in prefix.accepted_open.values()], n
        running_at += [n] if running else []
        restored.feed(verified.decode(n))
        assert restored.calls == whole.calls, n
        assert list(restored.projector.project().messages) == list(
            whole.projector.project().messages
        ), n
    assert running_at  # some checkpoints were taken while the call ran
    assert not whole.accepted_open  # the result came: nothing runs any more


async def test_polls_of_a_running_call_are_spaced_across_fast_steps(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Six quick steps while a build runs (it does not finish in the turn): spaced, the
    first look is at once and the next waits half a second, so the job is polled once or
    twice; without spacing (as before) it was polled before every step, six times."""
    polls = {}
    for spaced in (True, False):
        if not spaced:
            monkeypatch.setattr(longcalls, "_SPACING", (0.0, 0.0))
        seen: list[ModelRequest] = []
        with serve() as (base, ledger):
            ledger.finish_at = 1000
            script = [BUILD, *([NOTE] * 5), {"text": "all done"}]
            where = tmp_path / ("spaced" if spaced else "every")
            a = agent(where, [build_tool(base), note], seen, script=script)
            result = await a.run("build, then notes", session="s1")
            await a.close()
        assert result.status == "completed"
        polls[spaced] = len(ledger.polls)
    assert polls[False] == 6
    assert 1 <= polls[True] <= 3, polls


def test_poll_spacing_doubles_to_its_longest_pause() -> None:
    now = [100.0]
    spacing = longcalls.PollSpacing(first=0.5, longest=2.0, clock=lambda: now[0])
    assert spacing.due("c1")  # never polled: at once
    pauses = []
    for _ in range(4):
        spacing.polled("c1")
        start = now[0]
        assert not spacing.due("c1")
        while not spacing.due("c1"):
            now[0] += 0.25
        pauses.append(now[0] - start)
    assert pauses == [0.5, 1.0, 2.0, 2.0]
    assert spacing.due("c2")  # per call
