"""Recovery policies and resume over a real SQLite log.

A failed T2 commit (injected by wrapping the real store) leaves exactly the log a crash
after the effect and before T2 leaves: T1 without T2. A fresh agent then recovers.
"""

from __future__ import annotations

import asyncio
import hashlib
from pathlib import Path
from typing import Any

import pytest

from lodger.engine.settings import Services
from lodger.errors import CommitFailedError, ResumeBlockedError, UsageError
from lodger.events import (
    Event,
    OperatorDecision,
    RecoveryObserved,
    RunStarted,
    ToolDispatched,
    ToolResponded,
    TurnEnded,
    TurnStarted,
)
from lodger.ids import ManualClock, SequentialIds
from lodger.providers.base import ModelRequest, ToolResultMessage, UserMessage
from lodger.providers.scripted import ScriptedModel
from lodger.recovery import plan_recovery
from lodger.runtime.agent import Agent
from lodger.runtime.builtin import workspace_tools
from lodger.storage import EventLog, SqliteLogStore, Storage
from lodger.storage.logstore import Record
from lodger.testing import FaultyLogStore, MemoryArtifactStore
from lodger.tools import Tool, tool


class Effects:
    def __init__(self) -> None:
        self.calls: list[str] = []


def make_tools(effects: Effects) -> list[Tool]:
    @tool
    def charge(amount: int) -> str:
        """Charge a card (never retried)."""
        effects.calls.append(f"charge:{amount}")
        return f"charged {amount}"

    @tool(recovery="idempotent")
    def lookup(key: str) -> str:
        """Look something up (safe to repeat)."""
        effects.calls.append(f"lookup:{key}")
        return f"value of {key}"

    return [charge, lookup]


def fail_nth_t2(nth: int) -> Any:
    """A predicate for FaultyLogStore: fail the nth append that carries a T2."""
    seen = {"t2": 0}

    def predicate(records: list[Record]) -> bool:
        if any(b'"kind":"tool_responded"' in r.data for r in records):
            seen["t2"] += 1
            return seen["t2"] == nth
        return False

    return predicate


def make_agent(
    tmp_path: Path,
    script: list[dict[str, Any]],
    tools: list[Tool],
    *,
    store: Any = None,
    workspace: Path | None = None,
    ids_prefix: str = "a",
    seen: list[ModelRequest] | None = None,
    turns: list[list[dict[str, Any]]] | None = None,
) -> Agent:
    model = ScriptedModel(turns=turns) if turns is not None else ScriptedModel(script)
    if seen is not None:
        inner = model.complete

        async def complete(request: ModelRequest, *, on_text: Any = None) -> Any:
            seen.append(request)
            return await inner(request, on_text=on_text)

        model.complete = complete  # type: ignore[method-assign]
    return Agent(
        model=model,
        tools=tools,
        storage=Storage(
            log=EventLog(store or SqliteLogStore(tmp_path / "state")),
            artifacts=MemoryArtifactStore(),
        ),
        workspace=workspace,
        services=Services(clock=ManualClock(tick_us=10), ids=SequentialIds(ids_prefix)),
    )


async def crash_at_t2(
    tmp_path: Path, script: list[dict[str, Any]], tools: list[Tool], *, nth: int = 1, **kw: Any
) -> None:
    """Run until the nth T2 commit fails: the log a crash after that effect leaves."""
    store = FaultyLogStore(SqliteLogStore(tmp_path / "state"), fail_when=fail_nth_t2(nth))
    agent = make_agent(tmp_path, script, tools, store=store, **kw)
    with pytest.raises(CommitFailedError):
        await agent.run("do it", session="s1")
    await agent.close()


async def events_of(tmp_path: Path) -> list[Event]:
    log = EventLog(SqliteLogStore(tmp_path / "state"))
    try:
        return await log.read_all("s1")
    finally:
        await log.close()


SCRIPT_CHARGE = [{"calls": [{"name": "charge", "args": {"amount": 5}}]}, {"text": "paid"}]


async def test_never_retry_parks_and_operator_completes(tmp_path: Path) -> None:
    effects = Effects()
    await crash_at_t2(tmp_path, SCRIPT_CHARGE, make_tools(effects))
    assert effects.calls == ["charge:5"]

    agent = make_agent(tmp_path, SCRIPT_CHARGE, make_tools(effects), ids_prefix="b")
    plan = await agent.recovery_plan("s1")
    assert [(c.call_id, c.status, c.action) for c in plan.calls] == [
        ("call-0-1", "indeterminate", "park")
    ]
    with pytest.raises(ResumeBlockedError) as blocked:
        await agent.resume("s1")
    assert "call-0-1" in str(blocked.value)
    assert [(s.action, s.session_id, s.call_id) for s in blocked.value.next_steps] == [
        ("decide", "s1", "call-0-1"),
        ("abandon", "s1", None),
    ]
    # asking again records nothing new: the block is already a fact
    before = len(await events_of(tmp_path))
    with pytest.raises(ResumeBlockedError):
        await agent.resume("s1")
    assert len(await events_of(tmp_path)) == before

    await agent.decide("s1", "call-0-1", "completed", result="charged 5 (checked by hand)")
    result = await agent.resume("s1")
    assert (result.status, result.answer) == ("completed", "paid")
    assert effects.calls == ["charge:5"]  # never ran twice
    events = await events_of(tmp_path)
    runs = [e for e in events if isinstance(e.body, RunStarted)]
    assert len(runs) == 3  # original, the parked resume, the one that finished
    assert runs[2].body.parent_run_id == runs[1].run_id  # type: ignore[union-attr]
    assert runs[2].body.resumed_from is not None  # type: ignore[union-attr]
    assert sum(isinstance(e.body, TurnStarted) for e in events) == 1
    await agent.close()


async def test_idempotent_is_redispatched_under_a_linked_t1(tmp_path: Path) -> None:
    effects = Effects()
    script = [{"calls": [{"name": "lookup", "args": {"key": "k"}}]}, {"text": "found"}]
    await crash_at_t2(tmp_path, script, make_tools(effects))
    agent = make_agent(tmp_path, script, make_tools(effects), ids_prefix="b")
    result = await agent.resume("s1")
    assert result.answer == "found"
    assert effects.calls == ["lookup:k", "lookup:k"]
    t1s = [e.body for e in await events_of(tmp_path) if isinstance(e.body, ToolDispatched)]
    assert len(t1s) == 2
    assert t1s[1].retry_of == t1s[0].operation_id
    assert t1s[1].attempt == 2
    await agent.close()


async def test_replay_gives_history_once_and_never_reruns_tools(tmp_path: Path) -> None:
    effects = Effects()
    script = [
        {"calls": [{"name": "lookup", "args": {"key": "a"}}]},
        {"calls": [{"name": "charge", "args": {"amount": 1}}]},
        {"text": "done"},
    ]
    await crash_at_t2(tmp_path, script, make_tools(effects), nth=2)
    assert effects.calls == ["lookup:a", "charge:1"]
    seen: list[ModelRequest] = []
    agent = make_agent(tmp_path, script, make_tools(effects), ids_prefix="b", seen=seen)
    await agent.decide("s1", "call-1-1", "not_applied")
    result = await agent.resume("s1")
    assert result.answer == "done"
    assert effects.calls == ["lookup:a", "charge:1"]  # nothing re-ran
    request = seen[0]
    assert [m.text for m in request.messages if isinstance(m, UserMessage)] == ["do it"]
    results = [m for m in request.messages if isinstance(m, ToolResultMessage)]
    assert [(r.call_id, r.is_error) for r in results] == [("call-0-1", False), ("call-1-1", True)]
    assert "not applied" in results[1].content
    await agent.close()


def _sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


WRITE_SCRIPT = [
    {"calls": [{"name": "write_file", "args": {"path": "f.txt", "content": "new"}}]},
    {"text": "written"},
]


async def test_queryable_write_found_applied_is_completed_without_rewriting(
    tmp_path: Path,
) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "f.txt").write_text("old")
    await crash_at_t2(tmp_path, WRITE_SCRIPT, workspace_tools(), workspace=ws)
    assert (ws / "f.txt").read_text() == "new"
    t1 = next(e.body for e in await events_of(tmp_path) if isinstance(e.body, ToolDispatched))
    assert t1.expectations[0].before_sha256 == _sha("old")
    assert t1.expectations[0].after_sha256 == _sha("new")
    mtime = (ws / "f.txt").stat().st_mtime_ns

    agent = make_agent(tmp_path, WRITE_SCRIPT, workspace_tools(), workspace=ws, ids_prefix="b")
    assert [c.action for c in (await agent.recovery_plan("s1")).calls] == ["probe"]
    result = await agent.resume("s1")
    assert result.answer == "written"
    assert (ws / "f.txt").stat().st_mtime_ns == mtime  # not written again
    observed = [e.body for e in await events_of(tmp_path) if isinstance(e.body, RecoveryObserved)]
    assert [(o.status, o.reason) for o in observed] == [("completed", "probe_applied")]
    await agent.close()


async def test_queryable_write_at_before_hash_is_not_applied_and_model_is_told(
    tmp_path: Path,
) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "f.txt").write_text("old")
    await crash_at_t2(tmp_path, WRITE_SCRIPT, workspace_tools(), workspace=ws)
    (ws / "f.txt").write_text("old")  # as if the write never reached the disk
    seen: list[ModelRequest] = []
    agent = make_agent(
        tmp_path, WRITE_SCRIPT, workspace_tools(), workspace=ws, ids_prefix="b", seen=seen
    )
    await agent.resume("s1")
    result = next(m for m in seen[0].messages if isinstance(m, ToolResultMessage))
    assert result.is_error
    assert "not applied" in result.content
    assert (ws / "f.txt").read_text() == "old"
    await agent.close()


async def test_queryable_write_changed_by_someone_else_parks(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "f.txt").write_text("old")
    await crash_at_t2(tmp_path, WRITE_SCRIPT, workspace_tools(), workspace=ws)
    (ws / "f.txt").write_text("something else")
    agent = make_agent(tmp_path, WRITE_SCRIPT, workspace_tools(), workspace=ws, ids_prefix="b")
    with pytest.raises(ResumeBlockedError):
        await agent.resume("s1")
    plan = await agent.recovery_plan("s1")
    assert [(c.status, c.action) for c in plan.calls] == [("parked", "wait_operator")]
    await agent.close()


async def test_not_dispatched_call_is_told_to_the_model(tmp_path: Path) -> None:
    effects = Effects()
    script = [
        {
            "calls": [
                {"name": "lookup", "args": {"key": "a"}},
                {"name": "lookup", "args": {"key": "b"}},
            ]
        },
        {"text": "ok"},
    ]
    t1s = {"n": 0}

    def second_t1(records: list[Record]) -> bool:
        if any(b'"kind":"tool_dispatched"' in r.data for r in records):
            t1s["n"] += 1
            return t1s["n"] == 2
        return False

    store = FaultyLogStore(SqliteLogStore(tmp_path / "state"), fail_when=second_t1)
    agent = make_agent(tmp_path, script, make_tools(effects), store=store)
    with pytest.raises(CommitFailedError):
        await agent.run("do it", session="s1")
    await agent.close()
    plan = plan_recovery(await events_of(tmp_path))
    statuses = sorted((c.status, c.action) for c in plan.calls)
    assert statuses == [("indeterminate", "redispatch"), ("not_dispatched", "tell_model")]
    seen: list[ModelRequest] = []
    agent = make_agent(tmp_path, script, make_tools(effects), ids_prefix="b", seen=seen)
    assert (await agent.resume("s1")).answer == "ok"
    results = {m.call_id: m for m in seen[0].messages if isinstance(m, ToolResultMessage)}
    never = [r for r in results.values() if "never ran" in r.content]
    assert len(never) == 1
    await agent.close()


async def test_abandon_ends_the_turn_and_the_session_goes_on(tmp_path: Path) -> None:
    effects = Effects()
    await crash_at_t2(tmp_path, SCRIPT_CHARGE, make_tools(effects))
    script = [*SCRIPT_CHARGE, {"text": "second turn"}]
    agent = make_agent(tmp_path, script, make_tools(effects), ids_prefix="b")
    await agent.decide("s1", "call-0-1", "abandon")
    events = await events_of(tmp_path)
    assert isinstance(events[-1].body, TurnEnded)
    assert events[-1].body.status == "abandoned"
    assert any(isinstance(e.body, OperatorDecision) for e in events)
    with pytest.raises(UsageError, match="no interrupted turn"):
        await agent.resume("s1")
    result = await agent.run("next", session="s1")
    assert result.status == "completed"
    await agent.close()


async def test_decide_refuses_settled_calls(tmp_path: Path) -> None:
    effects = Effects()
    script = [
        {"calls": [{"name": "lookup", "args": {"key": "a"}}]},
        {"calls": [{"name": "charge", "args": {"amount": 1}}]},
        {"text": "done"},
    ]
    await crash_at_t2(tmp_path, script, make_tools(effects), nth=2)
    agent = make_agent(tmp_path, script, make_tools(effects), ids_prefix="b")
    with pytest.raises(UsageError, match="is completed"):
        await agent.decide("s1", "call-0-1", "completed")
    with pytest.raises(UsageError, match="not part of an interrupted turn"):
        await agent.decide("s1", "nope", "completed")
    await agent.close()


async def test_resume_checks_workspace_and_tool_bindings(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    effects = Effects()
    await crash_at_t2(tmp_path, SCRIPT_CHARGE, make_tools(effects), workspace=ws)
    other = tmp_path / "other"
    other.mkdir()
    agent = make_agent(tmp_path, SCRIPT_CHARGE, make_tools(effects), workspace=other)
    with pytest.raises(ResumeBlockedError, match="workspace"):
        await agent.resume("s1")
    await agent.close()
    agent = make_agent(tmp_path, SCRIPT_CHARGE, [], workspace=ws)
    with pytest.raises(ResumeBlockedError, match="not bound now: charge"):
        await agent.resume("s1")
    await agent.close()
    assert len([e for e in await events_of(tmp_path) if isinstance(e.body, RunStarted)]) == 1


async def test_run_on_an_interrupted_session_resumes_first(tmp_path: Path) -> None:
    effects = Effects()
    script = [
        {"calls": [{"name": "lookup", "args": {"key": "k"}}]},
        {"text": "first done"},
        {"text": "second done"},
    ]
    await crash_at_t2(tmp_path, script, make_tools(effects))
    turns = [script[:2], script[2:]]  # every turn plays its own script
    agent = make_agent(tmp_path, script, make_tools(effects), ids_prefix="b", turns=turns)
    result = await agent.run("second task", session="s1")
    assert result.answer == "second done"
    events = await events_of(tmp_path)
    ends = [e.body.answer for e in events if isinstance(e.body, TurnEnded)]
    assert ends == ["first done", "second done"]
    assert sum(isinstance(e.body, ToolResponded) for e in events) == 1
    await agent.close()


async def test_redispatch_waits_for_the_leases_a_first_dispatch_would_take(
    tmp_path: Path,
) -> None:
    from lodger.authority import Authorities, ResourceClaim

    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "f.txt").write_text("hello\n")
    script = [{"calls": [{"name": "read_file", "args": {"path": "f.txt"}}]}, {"text": "read"}]
    await crash_at_t2(tmp_path, script, workspace_tools(), workspace=ws)

    shared = Authorities()
    other = shared.reserve("another-session/c9", [ResourceClaim.file(ws / "f.txt", mode="write")])
    await other.acquire()  # another session is writing the file
    agent = make_agent(tmp_path, script, workspace_tools(), workspace=ws, ids_prefix="b")
    agent.authorities = shared
    resumed = asyncio.create_task(agent.resume("s1"))
    await asyncio.sleep(0.1)
    assert not resumed.done()  # the re-run read waits for the writer
    other.close()
    result = await asyncio.wait_for(resumed, 5)
    assert result.answer == "read"
    await agent.close()


async def test_a_second_resume_of_the_same_prefix_loses_the_claim(tmp_path: Path) -> None:
    """Only one run can continue a prefix: the claim is an append at its high-water mark.
    (The SQLite lock already keeps a second process out; this checks the claim itself, as
    an object-store backend without a lock would rely on it.)"""
    from lodger.events import EventDraft, RunStarted
    from lodger.events import Prefix as PrefixValue

    effects = Effects()
    await crash_at_t2(tmp_path, SCRIPT_CHARGE, make_tools(effects))
    inner = SqliteLogStore(tmp_path / "state")

    class RacingStore(FaultyLogStore):
        async def append_records(
            self, *, session_id: str, records: Any, expected_offset: int
        ) -> None:
            if any(b'"resumed_from":{' in r.data for r in records):
                # another resumer's claim lands first, at the same offset
                from lodger.events import seal

                prev = (await self.inner.last_record(session_id=session_id)).digest  # type: ignore[union-attr]
                rival = EventDraft(
                    id="rival",
                    ts=1,
                    turn_id="t",
                    run_id="rival-run",
                    body=RunStarted(
                        model="x", resumed_from=PrefixValue(high_water=expected_offset, digest=prev)
                    ),
                )
                event, data = seal(
                    rival, session_id=session_id, offset=expected_offset, prev_digest=prev
                )
                await self.inner.append_records(
                    session_id=session_id,
                    records=[Record(expected_offset, data, event.digest)],
                    expected_offset=expected_offset,
                )
            await super().append_records(
                session_id=session_id, records=records, expected_offset=expected_offset
            )

    agent = make_agent(
        tmp_path, SCRIPT_CHARGE, make_tools(effects), store=RacingStore(inner), ids_prefix="b"
    )
    with pytest.raises(ResumeBlockedError, match="another run already continues"):
        await agent.resume("s1")
    assert effects.calls == ["charge:5"]  # nothing ran for the loser
    await agent.close()
