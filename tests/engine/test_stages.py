"""One chain of stages for a first dispatch and for recovery's re-dispatch, over real SQLite.

A failed T2 commit (injected by wrapping the real store) leaves the log a crash after the
effect leaves: T1 without T2. A fresh agent resumes it; the bound tool is ``idempotent``,
so recovery runs it again. Every stage that has something to observe writes to one
trace (hooks, the claims and expectations hooks, the approver, the handler, and the store
for T1 and T2), so the order both paths took is compared as it happened.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from lodger.authority import ResourceClaim
from lodger.engine.hooks import CallInfo, CallResult, Rewrite, Veto
from lodger.engine.pipeline import CALL_STAGES
from lodger.engine.settings import Hooks, Services
from lodger.errors import CommitFailedError, ResumeBlockedError
from lodger.events import (
    CallRejected,
    Event,
    FileExpectation,
    PermissionDecided,
    RecoveryDecided,
    ToolDispatched,
    ToolResponded,
)
from lodger.ids import ManualClock, SequentialIds
from lodger.providers.scripted import ScriptedModel
from lodger.runtime.agent import Agent
from lodger.storage import EventLog, SqliteLogStore, Storage
from lodger.storage.logstore import Record
from lodger.testing import FaultyLogStore, MemoryArtifactStore
from lodger.tools import Tool, ToolContext, tool

SCRIPT = [{"calls": [{"name": "lookup", "args": {"key": "k"}}]}, {"text": "found"}]


class Traced(FaultyLogStore):
    """The real store, with each append that carries a T1 or a T2 written to the trace
    as it is attempted (the injected failure of the first T2 included)."""

    def __init__(self, inner: SqliteLogStore, trace: list[str], **kw: Any) -> None:
        super().__init__(inner, **kw)
        self.trace = trace

    async def append_records(self, *, session_id: str, records: Any, expected_offset: int) -> None:
        for r in records:
            if b'"kind":"tool_dispatched"' in r.data:
                self.trace.append("T1")
            if b'"kind":"tool_responded"' in r.data:
                self.trace.append("T2")
        await super().append_records(
            session_id=session_id, records=records, expected_offset=expected_offset
        )


def first_t2(records: list[Record]) -> bool:
    return any(b'"kind":"tool_responded"' in r.data for r in records)


def traced_tool(trace: list[str], **options: Any) -> Tool:
    def claims(arguments: dict[str, Any], ctx: ToolContext) -> list[ResourceClaim]:
        trace.append("claims")
        return [ResourceClaim.actor(f"lookup:{arguments['key']}")]

    async def expectations(arguments: dict[str, Any], ctx: ToolContext) -> list[FileExpectation]:
        trace.append("expectations")
        return []

    @tool(recovery="idempotent", claims=claims, expectations=expectations, **options)
    def lookup(key: str) -> str:
        """Look something up (safe to repeat)."""
        trace.append("execute")
        return f"value of {key}"

    return lookup


def agent(
    tmp_path: Path, trace: list[str], *, tools: list[Tool], fail_t2: bool, **kw: Any
) -> Agent:
    async def approver(t: Tool, arguments: dict[str, Any]) -> bool:
        trace.append("permission")
        return True

    def before(call: CallInfo) -> None:
        trace.append("before_call")

    def after(call: CallInfo, result: CallResult) -> None:
        trace.append("after_call")

    store = Traced(
        SqliteLogStore(tmp_path / "state"), trace, fail_when=first_t2 if fail_t2 else None
    )
    hooks: dict[str, Any] = {
        "approver": approver,
        "before_call": [before],
        "after_call": [after],
        **kw,
    }
    return Agent(
        model=ScriptedModel(SCRIPT),
        tools=tools,
        storage=Storage(log=EventLog(store), artifacts=MemoryArtifactStore()),
        hooks=Hooks(**hooks),
        services=Services(
            clock=ManualClock(tick_us=10), ids=SequentialIds("b" if not fail_t2 else "a")
        ),
    )


async def interrupted(tmp_path: Path, trace: list[str], **kw: Any) -> None:
    """A first dispatch whose T2 commit fails: T1 without T2 in the log."""
    first = agent(tmp_path, trace, tools=[traced_tool(trace, approval=True)], fail_t2=True, **kw)
    with pytest.raises(CommitFailedError):
        await first.run("look it up", session="s1")
    await first.close()


async def events_of(tmp_path: Path) -> list[Event]:
    log = EventLog(SqliteLogStore(tmp_path / "state"))
    try:
        return await log.read_all("s1")
    finally:
        await log.close()


def of(events: list[Event], kind: type) -> list[Any]:
    return [e.body for e in events if isinstance(e.body, kind)]


async def test_a_redispatch_takes_the_stages_of_a_first_dispatch_in_the_same_order(
    tmp_path: Path,
) -> None:
    first: list[str] = []
    await interrupted(tmp_path, first)
    again: list[str] = []
    resumed = agent(tmp_path, again, tools=[traced_tool(again, approval=True)], fail_t2=False)
    result = await resumed.run("look it up", session="s1")  # resumes first, then the turn
    await resumed.close()
    assert result.status == "completed"
    expected = ["before_call", "claims", "permission", "expectations", "T1", "execute",
                "after_call", "T2"]  # fmt: skip
    assert first == expected
    assert again[: len(expected)] == expected  # the re-dispatch, then the new turn's call
    # and that is CALL_STAGES' order, the stages with nothing to observe left out
    assert sorted(expected, key=CALL_STAGES.index) == expected
    t1s = of(await events_of(tmp_path), ToolDispatched)
    assert t1s[1].retry_of == t1s[0].operation_id and t1s[1].attempt == 2
    assert t1s[1].resources == ("actor:lookup:k",)


async def test_a_before_call_hook_that_vetoes_stops_the_redispatch_and_recovery_parks(
    tmp_path: Path,
) -> None:
    await interrupted(tmp_path, [])
    seen: list[CallInfo] = []

    def no_reruns(call: CallInfo) -> Veto | None:
        seen.append(call)
        return Veto("no re-runs today")

    trace: list[str] = []
    resumed = agent(
        tmp_path, trace, tools=[traced_tool(trace)], fail_t2=False, before_call=[no_reruns]
    )
    with pytest.raises(ResumeBlockedError):
        await resumed.resume("s1")
    await resumed.close()
    assert trace == []  # no claims, no permission, not run
    (call,) = seen
    assert (call.call_id, call.tool, dict(call.arguments)) == ("call-0-1", "lookup", {"key": "k"})
    assert call.origin == "provider"  # the call's own origin, as at its first dispatch
    events = await events_of(tmp_path)
    (parked,) = of(events, RecoveryDecided)
    assert parked.action == "park"
    assert parked.reason == "not run again: lookup was vetoed: no re-runs today"
    assert len(of(events, ToolDispatched)) == 1 and of(events, ToolResponded) == []
    assert of(events, CallRejected) == []  # a refused re-run is recovery's to record


async def test_a_before_call_rewrite_is_what_the_new_t1_records_and_runs(tmp_path: Path) -> None:
    await interrupted(tmp_path, [])

    def narrow(call: CallInfo) -> Rewrite:
        return Rewrite({"key": f"{call.arguments['key']}-checked"})

    trace: list[str] = []
    resumed = agent(
        tmp_path, trace, tools=[traced_tool(trace)], fail_t2=False, before_call=[narrow]
    )
    await resumed.resume("s1")
    await resumed.close()
    t1s = of(await events_of(tmp_path), ToolDispatched)
    assert [t1.arguments for t1 in t1s] == [{"key": "k"}, {"key": "k-checked"}]
    assert t1s[1].resources == ("actor:lookup:k-checked",)  # claimed for what runs


async def test_a_redispatch_is_checked_against_the_schema_bound_now(tmp_path: Path) -> None:
    await interrupted(tmp_path, [])
    trace: list[str] = []

    @tool(recovery="idempotent")
    def lookup(key: int) -> str:
        """Look something up by number."""
        trace.append("execute")
        return "?"

    resumed = agent(tmp_path, trace, tools=[lookup], fail_t2=False)
    with pytest.raises(ResumeBlockedError):
        await resumed.resume("s1")
    await resumed.close()
    assert trace == []  # the hooks come after the schema: nothing ran, no hook saw it
    (parked,) = of(await events_of(tmp_path), RecoveryDecided)
    assert parked.reason.startswith("not run again: the recorded arguments of lookup fail")


async def test_a_redispatch_asks_permission_and_a_denial_parks(tmp_path: Path) -> None:
    await interrupted(tmp_path, [])
    asked: list[str] = []

    async def deny(t: Tool, arguments: dict[str, Any]) -> bool:
        asked.append(t.name)
        return False

    trace: list[str] = []
    resumed = agent(
        tmp_path, trace, tools=[traced_tool(trace, approval=True)], fail_t2=False, approver=deny
    )
    with pytest.raises(ResumeBlockedError):
        await resumed.resume("s1")
    await resumed.close()
    assert asked == ["lookup"]
    assert trace == ["before_call", "claims"]  # what comes before permission, then no more
    events = await events_of(tmp_path)
    assert [d.decision for d in of(events, PermissionDecided)][-1] == "deny"
    assert of(events, RecoveryDecided)[0].reason.startswith("not run again: ")
