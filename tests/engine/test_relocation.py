"""Relocation and abandon through the engine and the sessions service, over a real SQLite
log and real directories: the ways out of a turn that cannot resume where it is."""

from __future__ import annotations

import os
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from lodger.engine.relocation import expected_files, find_mismatches
from lodger.engine.settings import Services
from lodger.errors import CommitFailedError, ResumeBlockedError, UsageError
from lodger.events import (
    Event,
    FileExpectation,
    OperatorDecision,
    RecoveryObserved,
    RunEnded,
    RunStarted,
    ToolDispatched,
    ToolResponded,
    TurnEnded,
)
from lodger.ids import ManualClock, SequentialIds
from lodger.providers.scripted import ScriptedModel
from lodger.runtime.agent import Agent
from lodger.runtime.builtin import workspace_tools
from lodger.runtime.sessions import Sessions
from lodger.storage import EventLog, SqliteLogStore, Storage
from lodger.storage.logstore import Record
from lodger.testing import FaultyLogStore, MemoryArtifactStore
from lodger.tools import Tool, tool


def _write(path: str, content: str) -> dict[str, Any]:
    return {"calls": [{"name": "write_file", "args": {"path": path, "content": content}}]}


SCRIPT = [
    _write("a.txt", "one"),
    _write("a.txt", "two"),
    {"text": "first done"},
    _write("b.txt", "bee"),
    {"text": "second done"},
    {"text": "third done"},
]
TURNS = [SCRIPT[:3], SCRIPT[3:5], SCRIPT[5:]]  # each turn plays its own script


def nth_t2(nth: int) -> Any:
    seen = {"t2": 0}

    def predicate(records: Sequence[Record]) -> bool:
        if any(b'"kind":"tool_responded"' in r.data for r in records):
            seen["t2"] += 1
            return seen["t2"] == nth
        return False

    return predicate


def make_agent(
    tmp_path: Path,
    workspace: Path,
    prefix: str,
    *,
    tools: list[Tool] | None = None,
    fail: Any = None,
) -> Agent:
    store: Any = SqliteLogStore(tmp_path / "state")
    if fail is not None:
        store = FaultyLogStore(store, fail_when=fail)
    return Agent(
        model=ScriptedModel(turns=TURNS),
        tools=workspace_tools() if tools is None else tools,
        storage=Storage(log=EventLog(store), artifacts=MemoryArtifactStore()),
        workspace=workspace,
        services=Services(clock=ManualClock(tick_us=10), ids=SequentialIds(prefix)),
    )


async def events_of(tmp_path: Path) -> list[Event]:
    log = EventLog(SqliteLogStore(tmp_path / "state"))
    try:
        return await log.read_all("s1")
    finally:
        await log.close()


async def crash(tmp_path: Path, workspace: Path, prefix: str, task: str, nth: int) -> None:
    agent = make_agent(tmp_path, workspace, prefix, fail=nth_t2(nth))
    with pytest.raises(CommitFailedError):
        await agent.run(task, session="s1")
    await agent.close()


def _event(offset: int, body: Any) -> Event:
    return Event(offset=offset, session_id="s", id=f"e{offset}", ts=0, body=body, call_id="c")


def _t1(op: str, path: str, before: str | None, after: str | None) -> ToolDispatched:
    return ToolDispatched(
        operation_id=op,
        tool="write_file",
        arguments={},
        expectations=(FileExpectation(path=path, before_sha256=before, after_sha256=after),),
    )


def test_expected_files_follow_each_paths_last_known_write() -> None:
    bodies = [
        _t1("op1", "a", None, "A1"),
        ToolResponded(operation_id="op1", status="ok", content=""),
        _t1("op2", "a", "A1", "A2"),
        ToolResponded(operation_id="op2", status="error", content="disk full"),
        _t1("op3", "b", "B0", "B1"),
        OperatorDecision(operation_id="op3", decision="not_applied"),
        _t1("op4", "c", None, "C1"),
        RecoveryObserved(operation_id="op4", status="completed", reason="probe_applied"),
        _t1("op5", "d", "D0", "D1"),  # no outcome at all: indeterminate
        _t1("op6", "e", "E0", "E1"),
        ToolResponded(operation_id="op6", status="ok", content=""),
        _t1("op7", "e", "E1", "E2"),
        ToolResponded(operation_id="op7", status="ok", content=""),
    ]
    allowed = expected_files([_event(i, b) for i, b in enumerate(bodies)])
    assert allowed == {
        "a": frozenset({"A1", "A2"}),  # a failed response proves neither
        "b": frozenset({"B0"}),
        "c": frozenset({"C1"}),
        "d": frozenset({"D0", "D1"}),
        "e": frozenset({"E2"}),
    }


def test_find_mismatches_names_absent_changed_and_unreadable_files(tmp_path: Path) -> None:
    import hashlib

    (tmp_path / "same").write_text("x")
    (tmp_path / "changed").write_text("y")
    (tmp_path / "dir").mkdir()
    x = hashlib.sha256(b"x").hexdigest()
    allowed = {
        "same": frozenset({x}),
        "changed": frozenset({x}),
        "missing": frozenset({x}),
        "gone-ok": frozenset({None}),
        "dir": frozenset({x}),
        "../outside": frozenset({x}),
    }
    found = {m.path: m for m in find_mismatches(tmp_path, allowed)}
    assert sorted(found) == ["../outside", "changed", "dir", "missing"]
    assert (
        found["missing"].describe() == f"file 'missing' is absent; the log expects sha256 {x[:16]}"
    )
    assert found["changed"].found == hashlib.sha256(b"y").hexdigest()
    assert found["dir"].unreadable is not None
    assert "outside the workspace" in found["../outside"].describe()


async def test_a_relocation_is_kept_for_later_turns_and_resumes(tmp_path: Path) -> None:
    ws, moved = tmp_path / "ws", tmp_path / "moved"
    ws.mkdir()
    await crash(tmp_path, ws, "a", "first", nth=2)  # a.txt "one" answered, "two" not
    os.rename(ws, moved)

    agent = make_agent(tmp_path, moved, "b")
    result = await agent.resume("s1", relocate=True)
    assert result.status == "completed"
    await agent.close()

    # a later turn crashes in the new workspace; resuming there needs no relocation now
    await crash(tmp_path, moved, "c", "second", nth=1)
    agent = make_agent(tmp_path, moved, "d")
    assert (await agent.resume("s1")).answer == "second done"
    await agent.close()
    sessions = Sessions(
        Storage(log=EventLog(SqliteLogStore(tmp_path / "state")), artifacts=MemoryArtifactStore())
    )
    assert (await sessions.defaults("s1")).workspace == str(moved)
    await sessions.close()

    runs = [e.body for e in await events_of(tmp_path) if isinstance(e.body, RunStarted)]
    assert [r.workspace for r in runs] == [None, str(moved), None, None]


async def test_a_session_without_file_hashes_relocates(tmp_path: Path) -> None:
    @tool(recovery="idempotent")
    def lookup(key: str) -> str:
        """Look something up."""
        return key

    script = [{"calls": [{"name": "lookup", "args": {"key": "k"}}]}, {"text": "done"}]
    ws, other = tmp_path / "ws", tmp_path / "other"
    ws.mkdir()
    other.mkdir()
    store = FaultyLogStore(SqliteLogStore(tmp_path / "state"), fail_when=nth_t2(1))
    agent = Agent(
        model=ScriptedModel(script),
        tools=[lookup],
        storage=Storage(log=EventLog(store), artifacts=MemoryArtifactStore()),
        workspace=ws,
    )
    with pytest.raises(CommitFailedError):
        await agent.run("go", session="s1")
    await agent.close()
    agent = Agent(
        model=ScriptedModel(script),
        tools=[lookup],
        storage=Storage(
            log=EventLog(SqliteLogStore(tmp_path / "state")), artifacts=MemoryArtifactStore()
        ),
        workspace=other,
    )
    with pytest.raises(ResumeBlockedError) as refused:
        await agent.resume("s1")
    assert [s.action for s in refused.value.next_steps] == ["relocate", "abandon"]
    assert (await agent.resume("s1", relocate=True)).answer == "done"
    await agent.close()


async def test_run_on_a_parked_turn_names_decide_and_abandon(tmp_path: Path) -> None:
    @tool
    def charge(amount: int) -> str:
        """Charge a card (never retried)."""
        return f"charged {amount}"

    ws = tmp_path / "ws"
    ws.mkdir()
    script = [
        {"calls": [{"name": "charge", "args": {"amount": 5}}]},
        {"text": "paid"},
        {"text": "again"},
    ]
    store = FaultyLogStore(SqliteLogStore(tmp_path / "state"), fail_when=nth_t2(1))
    agent = Agent(
        model=ScriptedModel(script),
        tools=[charge],
        storage=Storage(log=EventLog(store), artifacts=MemoryArtifactStore()),
        workspace=ws,
    )
    with pytest.raises(CommitFailedError):
        await agent.run("pay", session="s1")
    await agent.close()
    agent = Agent(
        model=ScriptedModel(script),
        tools=[charge],
        storage=Storage(
            log=EventLog(SqliteLogStore(tmp_path / "state")), artifacts=MemoryArtifactStore()
        ),
        workspace=ws,
    )
    for _ in range(2):  # the first parks the call (and ends its run), the second finds it parked
        with pytest.raises(ResumeBlockedError) as blocked:
            await agent.run("pay again", session="s1")
        assert [(s.action, s.call_id) for s in blocked.value.next_steps] == [
            ("decide", "call-0-1"),
            ("abandon", None),
        ]
    await agent.close()

    # the run ended parked: abandon adds no run_ended, only the decision and the turn's end
    sessions = Sessions(
        Storage(log=EventLog(SqliteLogStore(tmp_path / "state")), artifacts=MemoryArtifactStore())
    )
    appended = await sessions.abandon("s1", reason="card declined elsewhere")
    assert [type(e.body) for e in appended] == [OperatorDecision, TurnEnded]
    assert not any(isinstance(e.body, RunEnded) for e in appended)
    with pytest.raises(UsageError) as nothing:
        await sessions.abandon("s1")
    assert nothing.value.code == "nothing_to_abandon"
    await sessions.close()
    agent = Agent(
        model=ScriptedModel(script),
        tools=[charge],
        storage=Storage(
            log=EventLog(SqliteLogStore(tmp_path / "state")), artifacts=MemoryArtifactStore()
        ),
        workspace=ws,
    )
    assert (await agent.run("pay again", session="s1")).status == "completed"
    await agent.close()


async def test_relocating_needs_a_workspace(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    await crash(tmp_path, ws, "a", "first", nth=1)
    shutil.rmtree(ws)
    agent = Agent(
        model=ScriptedModel(turns=TURNS),
        tools=workspace_tools(),
        storage=Storage(
            log=EventLog(SqliteLogStore(tmp_path / "state")), artifacts=MemoryArtifactStore()
        ),
    )
    with pytest.raises(UsageError) as refused:
        await agent.resume("s1", relocate=True)
    assert refused.value.code == "no_workspace"
    await agent.close()
