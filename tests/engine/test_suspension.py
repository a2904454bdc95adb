"""A call that suspends (its work runs elsewhere) over a real SQLite log: the run ends
waiting with T1 and no T2, the turn stays open, and resume's probe either says the work
is still pending (the run waits again, nothing recorded for the call) or settles it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from lodger.engine.settings import Services
from lodger.events import Event, RecoveryObserved, RunEnded, ToolDispatched, ToolResponded
from lodger.ids import ManualClock, SequentialIds
from lodger.providers.scripted import ScriptedModel
from lodger.runtime.agent import Agent
from lodger.storage import EventLog, SqliteLogStore, Storage
from lodger.testing import MemoryArtifactStore
from lodger.tools import Tool
from lodger.tools.spec import ProbeResult, Suspended, ToolContext


class Remote:
    """Work handed off to somewhere else; the test decides when it is done."""

    def __init__(self) -> None:
        self.started: list[str] = []
        self.done: dict[str, str] = {}


def remote_tool(remote: Remote) -> Tool:
    async def handler(arguments: dict[str, Any], ctx: ToolContext) -> Suspended:
        remote.started.append(f"{arguments['job']}@{ctx.call_id}")
        return Suspended(reason=f"job {arguments['job']} runs elsewhere")

    async def probe(dispatched: ToolDispatched, ctx: ToolContext) -> ProbeResult:
        job = str(dispatched.arguments["job"])
        if job not in remote.done:
            return ProbeResult(applied=None, pending=True, observation=f"{job} still runs")
        return ProbeResult(applied=True, observation="done", content=remote.done[job])

    return Tool(
        name="remote",
        description="Run a job elsewhere.",
        parameters={"type": "object", "properties": {"job": {"type": "string"}},
                    "required": ["job"]},
        handler=handler,
        recovery="queryable",
        probe=probe,
    )  # fmt: skip


SCRIPT = [
    {"calls": [{"name": "remote", "args": {"job": "a"}}, {"name": "remote", "args": {"job": "b"}}]},
    {"text": "both jobs reported"},
]


def agent(tmp_path: Path, remote: Remote) -> Agent:
    return Agent(
        model=ScriptedModel(SCRIPT),
        tools=[remote_tool(remote)],
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


async def test_suspended_calls_end_the_run_waiting_and_a_probe_settles_them(
    tmp_path: Path,
) -> None:
    remote = Remote()
    first = agent(tmp_path, remote)
    result = await first.run("run two jobs", session="s1")
    await first.close()
    assert result.status == "waiting"
    assert remote.started == ["a@call-0-1", "b@call-0-2"]
    events = await events_of(tmp_path)
    assert [e for e in events if isinstance(e.body, ToolResponded)] == []  # no T2
    assert len([e for e in events if isinstance(e.body, ToolDispatched)]) == 2
    last = events[-1].body
    assert isinstance(last, RunEnded) and last.status == "interrupted"
    assert last.error is not None and "call-0-1, call-0-2" in last.error

    # Woken with one job done: it is settled, the other is pending; the run waits again.
    remote.done["a"] = "job a: 3 rows"
    second = agent(tmp_path, remote)
    again = await second.resume("s1")
    await second.close()
    assert again.status == "waiting" and again.error is not None
    assert "call-0-2" in again.error and "call-0-1" not in again.error
    observed = [e for e in await events_of(tmp_path) if isinstance(e.body, RecoveryObserved)]
    assert [(e.call_id, e.body.observation) for e in observed] == [("call-0-1", "job a: 3 rows")]

    # Woken with both done: the turn goes on with both results and nothing ran again.
    remote.done["b"] = "job b: 5 rows"
    third = agent(tmp_path, remote)
    final = await third.resume("s1")
    await third.close()
    assert final.status == "completed" and final.answer == "both jobs reported"
    assert remote.started == ["a@call-0-1", "b@call-0-2"]
    events = await events_of(tmp_path)
    observed = [e for e in events if isinstance(e.body, RecoveryObserved)]
    assert [e.body.observation for e in observed] == ["job a: 3 rows", "job b: 5 rows"]
    assert len([e for e in events if isinstance(e.body, ToolDispatched)]) == 2
    assert "job b: 5 rows" in str(final.messages)
