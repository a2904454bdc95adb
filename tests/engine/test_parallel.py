"""Parallel calls through the authorities, end to end over a real SQLite log.

Every test runs whole turns (scripted model, real log, real workspace files) and forces
interleavings with events rather than sleeps; each one fails if the behaviour it names is
taken away (leases, emission-order reservation, fairness, freezing, settling).
"""

from __future__ import annotations

import asyncio
import json
import random
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from lodger.authority import ResourceClaim
from lodger.engine.settings import Hooks, Limits, Services
from lodger.engine.state import SessionState
from lodger.errors import CommitFailedError
from lodger.events import (
    CallRejected,
    Event,
    PermissionRequested,
    ProposedCall,
    RunEnded,
    ToolDispatched,
    ToolResponded,
    TurnEnded,
)
from lodger.ids import ManualClock, SequentialIds
from lodger.providers.base import ModelRequest, ModelResponse, ToolResultMessage
from lodger.providers.scripted import FunctionModel
from lodger.runtime.agent import Agent
from lodger.runtime.builtin import edit_file, read_file, workspace_tools
from lodger.storage import EventLog, SqliteLogStore, Storage
from lodger.storage.logstore import LogStore, Record
from lodger.testing import FaultyLogStore, MemoryArtifactStore
from lodger.tools import Tool, ToolContext, tool
from lodger.tools.workspace import resolve_in_workspace

# ---------------------------------------------------------------- harness


class Batches:
    """A model that proposes the given batches one step each, then answers "done"."""

    def __init__(self, *batches: Sequence[tuple[str, dict[str, Any]]]) -> None:
        self.batches = batches
        self.requests: list[ModelRequest] = []

    def __call__(self, request: ModelRequest) -> ModelResponse:
        self.requests.append(request)
        step = len(self.requests) - 1
        if step >= len(self.batches):
            return ModelResponse(text="done")
        return ModelResponse(
            calls=tuple(
                ProposedCall(call_id=f"c{step}-{i}", name=name, arguments=json.dumps(args))
                for i, (name, args) in enumerate(self.batches[step])
            )
        )


def make_agent(
    tmp_path: Path, model: Batches, tools: Sequence[Tool], store: LogStore | None = None, **kw: Any
) -> Agent:
    workspace = tmp_path / "ws"
    workspace.mkdir(exist_ok=True)
    return Agent(
        model=FunctionModel(model),
        tools=tools,
        storage=Storage(
            log=EventLog(store or SqliteLogStore(tmp_path / "state")),
            artifacts=MemoryArtifactStore(),
        ),
        workspace=workspace,
        services=Services(clock=ManualClock(tick_us=10), ids=SequentialIds("id")),
        **kw,
    )


def by_call(events: Sequence[Event], body: type) -> dict[str, Event]:
    return {e.call_id: e for e in events if isinstance(e.body, body) and e.call_id is not None}


def file_claims(mode: str) -> Any:
    def claims(arguments: dict[str, Any], ctx: ToolContext) -> list[ResourceClaim]:
        root = ctx.require_workspace()
        target = resolve_in_workspace(root, arguments["path"], must_exist=False)
        return [ResourceClaim.file(target, mode=mode, root=root)]  # type: ignore[arg-type]

    return claims


class Gates:
    """Tools that note when they start and end and wait for the test to let them finish."""

    def __init__(self) -> None:
        self.log: list[str] = []
        self.open: dict[str, asyncio.Event] = defaultdict(asyncio.Event)
        self.reached: dict[str, asyncio.Event] = defaultdict(asyncio.Event)

    def note(self, entry: str) -> None:
        self.log.append(entry)
        self.reached[entry].set()

    async def seen(self, entry: str) -> None:
        async with asyncio.timeout(5):
            await self.reached[entry].wait()

    def started(self) -> list[str]:
        return [e.removeprefix("start:") for e in self.log if e.startswith("start:")]

    def tools(self) -> list[Tool]:
        async def run(tag: str) -> str:
            self.note(f"start:{tag}")
            try:
                await self.open[tag].wait()
            except asyncio.CancelledError:
                self.note(f"cancelled:{tag}")
                raise
            self.note(f"end:{tag}")
            return tag

        @tool(claims=file_claims("read"))
        async def peek(path: str, tag: str) -> str:
            """Read a file slowly."""
            return await run(tag)

        @tool(claims=file_claims("write"))
        async def poke(path: str, tag: str) -> str:
            """Write a file slowly."""
            return await run(tag)

        @tool(approval=True)
        async def risky(tag: str) -> str:
            """Needs approval."""
            return await run(tag)

        return [peek, poke, risky]


# ---------------------------------------------------------------- consistency and order


async def test_read_edit_read_of_one_file_run_in_emission_order(tmp_path: Path) -> None:
    model = Batches(
        [
            ("read_file", {"path": "a.txt"}),
            ("edit_file", {"path": "a.txt", "old_string": "old", "new_string": "new"}),
            ("read_file", {"path": "link-to-a"}),
            ("read_file", {"path": "b.txt"}),
        ]
    )
    agent = make_agent(tmp_path, model, workspace_tools())
    (tmp_path / "ws" / "a.txt").write_text("old\n")
    (tmp_path / "ws" / "b.txt").write_text("b\n")
    (tmp_path / "ws" / "link-to-a").symlink_to("a.txt")
    assert (await agent.run("go", session="s1")).status == "completed"
    events = await agent.session("s1").events()
    t1, t2 = by_call(events, ToolDispatched), by_call(events, ToolResponded)
    assert "old" in t2["c0-0"].body.content  # type: ignore[union-attr]
    assert "new" in t2["c0-2"].body.content  # type: ignore[union-attr]
    # Each conflicting call starts only after the one before it has committed its T2.
    assert t2["c0-0"].offset < t1["c0-1"].offset < t2["c0-1"].offset < t1["c0-2"].offset
    assert [t1[c].body.resources for c in ("c0-0", "c0-1", "c0-2", "c0-3")] == [  # type: ignore[union-attr]
        ("read file:a.txt",),
        ("write file:a.txt",),
        ("read file:a.txt",),
        ("read file:b.txt",),
    ]
    # The model gets results in the order it emitted the calls.
    results = [m.call_id for m in model.requests[1].messages if isinstance(m, ToolResultMessage)]
    assert results == ["c0-0", "c0-1", "c0-2", "c0-3"]
    await agent.close()


async def test_edits_through_different_spellings_never_lose_an_update(tmp_path: Path) -> None:
    rng = random.Random(7)

    @tool(claims=file_claims("write"))
    async def append_line(path: str, line: str, ctx: ToolContext) -> str:
        """Read-modify-write with a pause in the middle: a lost update if unprotected."""
        target = resolve_in_workspace(ctx.require_workspace(), path, must_exist=True)
        before = await asyncio.to_thread(target.read_text)
        await asyncio.sleep(rng.uniform(0, 0.002))
        await asyncio.to_thread(target.write_text, before + line + "\n")
        return "ok"

    spellings = ["notes.txt", "./notes.txt", "sub/../notes.txt", "alias", "dir-alias/../notes.txt"]
    iterations = 50
    batches = [
        [("append_line", {"path": p, "line": f"{i}:{p}"}) for p in spellings]
        for i in range(iterations)
    ]
    agent = make_agent(
        tmp_path, Batches(*batches), [append_line], limits=Limits(max_steps=iterations + 1)
    )
    ws = tmp_path / "ws"
    (ws / "sub").mkdir()
    (ws / "notes.txt").write_text("")
    (ws / "alias").symlink_to("notes.txt")
    (ws / "dir-alias").symlink_to("sub")
    assert (await agent.run("go", session="s1")).status == "completed"
    lines = (ws / "notes.txt").read_text().splitlines()
    assert len(lines) == iterations * len(spellings)
    # Emission order is the order of the lines within each batch.
    assert lines[: len(spellings)] == [f"0:{p}" for p in spellings]
    await agent.close()


async def test_builtin_edits_see_each_others_results(tmp_path: Path) -> None:
    model = Batches(
        [
            ("edit_file", {"path": "cfg.py", "old_string": "A = 1", "new_string": "A = 2"}),
            ("edit_file", {"path": "./link.py", "old_string": "B = 1", "new_string": "B = 2"}),
        ]
    )
    agent = make_agent(tmp_path, model, [edit_file, read_file])
    (tmp_path / "ws" / "cfg.py").write_text("A = 1\nB = 1\n")
    (tmp_path / "ws" / "link.py").symlink_to("cfg.py")
    await agent.run("go", session="s1")
    assert (tmp_path / "ws" / "cfg.py").read_text() == "A = 2\nB = 2\n"
    t1 = by_call(await agent.session("s1").events(), ToolDispatched)
    first, second = t1["c0-0"].body.expectations[0], t1["c0-1"].body.expectations[0]  # type: ignore[union-attr]
    # The second edit's expectation was taken under its lease, after the first edit.
    assert second.before_sha256 == first.after_sha256
    await agent.close()


async def test_independent_slow_calls_overlap(tmp_path: Path) -> None:
    meet = asyncio.Barrier(4)

    @tool(claims=file_claims("write"))
    async def slow_write(path: str) -> str:
        """Waits until all four writers are running at once."""
        await meet.wait()
        return path

    model = Batches([("slow_write", {"path": f"f{i}.txt"}) for i in range(4)])
    agent = make_agent(tmp_path, model, [slow_write])
    async with asyncio.timeout(5):  # serialized calls would never meet
        assert (await agent.run("go", session="s1")).status == "completed"
    assert agent.authorities.files.statistics().waits == 0
    await agent.close()


async def test_a_queued_writer_is_not_overtaken_by_a_later_reader(tmp_path: Path) -> None:
    gates = Gates()
    model = Batches(
        [
            ("peek", {"path": "a.txt", "tag": "r1"}),
            ("poke", {"path": "a.txt", "tag": "w"}),
            ("peek", {"path": "a.txt", "tag": "r2"}),
            ("peek", {"path": "other.txt", "tag": "x"}),
        ]
    )
    agent = make_agent(tmp_path, model, gates.tools())
    gates.open["x"].set()
    turn = asyncio.create_task(agent.run("go", session="s1"))
    await gates.seen("end:x")  # independent work went ahead
    await gates.seen("start:r1")
    await asyncio.sleep(0.02)
    assert gates.started() == ["r1", "x"] or gates.started() == ["x", "r1"]
    stats = agent.authorities.files.statistics()
    assert [h.owner for h in stats.holders] == ["s1/c0-0"]
    assert [w.owner for w in stats.waiters] == ["s1/c0-1", "s1/c0-2"]
    gates.open["r1"].set()
    await gates.seen("start:w")
    await asyncio.sleep(0.02)
    assert "start:r2" not in gates.log  # r2 could share with r1 but w came first
    gates.open["w"].set()
    gates.open["r2"].set()
    async with asyncio.timeout(5):
        assert (await turn).status == "completed"
    assert gates.log.index("end:w") < gates.log.index("start:r2")
    await agent.close()


async def test_conflicting_calls_acquire_in_emission_order_whatever_permission_takes(
    tmp_path: Path,
) -> None:
    gates = Gates()
    approve = asyncio.Event()

    async def approver(t: Tool, arguments: dict[str, Any]) -> bool:
        await approve.wait()
        return True

    @tool(approval=True, claims=file_claims("write"))
    async def guarded_write(path: str, tag: str) -> str:
        """A write that needs approval."""
        gates.note(f"start:{tag}")
        return tag

    model = Batches(
        [
            ("guarded_write", {"path": "a.txt", "tag": "first"}),
            ("peek", {"path": "a.txt", "tag": "second"}),
            ("peek", {"path": "b.txt", "tag": "independent"}),
        ]
    )
    agent = make_agent(
        tmp_path, model, [*gates.tools(), guarded_write], hooks=Hooks(approver=approver)
    )
    gates.open["second"].set()
    gates.open["independent"].set()
    turn = asyncio.create_task(agent.run("go", session="s1"))
    await gates.seen("end:independent")  # not held up by the pending approval
    await asyncio.sleep(0.02)
    assert "start:second" not in gates.log  # waits for the call emitted before it
    approve.set()
    async with asyncio.timeout(5):
        assert (await turn).status == "completed"
    assert gates.log.index("start:first") < gates.log.index("start:second")
    await agent.close()


# ---------------------------------------------------------------- cancellation


async def test_cancelling_a_batch_starts_nothing_new_and_records_every_started_call(
    tmp_path: Path,
) -> None:
    gates = Gates()
    model = Batches(
        [
            ("poke", {"path": "a.txt", "tag": "running"}),
            ("poke", {"path": "a.txt", "tag": "queued"}),
            ("peek", {"path": "b.txt", "tag": "independent"}),
        ]
    )
    agent = make_agent(tmp_path, model, gates.tools())
    turn = asyncio.create_task(agent.run("go", session="s1"))
    await gates.seen("start:running")
    await gates.seen("start:independent")
    turn.cancel()
    with pytest.raises(asyncio.CancelledError):
        await turn
    assert gates.started() == ["running", "independent"]
    assert sorted(e for e in gates.log if e.startswith("cancelled:")) == [
        "cancelled:independent",
        "cancelled:running",
    ]
    events = await agent.session("s1").events()
    t1, t2 = by_call(events, ToolDispatched), by_call(events, ToolResponded)
    assert set(t1) == set(t2) == {"c0-0", "c0-2"}  # the queued call never dispatched
    assert {t2[c].body.status for c in t2} == {"cancelled"}  # type: ignore[union-attr]
    # the run ends interrupted and the turn stays open for a resume
    assert isinstance(events[-1].body, RunEnded) and events[-1].body.status == "interrupted"
    assert not any(isinstance(e.body, TurnEnded) for e in events)
    assert all(not s.holders and not s.waiters for s in agent.authorities.statistics())
    await agent.close()


class GatedStore(FaultyLogStore):
    """Holds the append of one call's T1 until the test lets it through."""

    def __init__(self, inner: LogStore, call_id: str) -> None:
        super().__init__(inner)
        self.marker = f'"call_id":"{call_id}"'.encode()
        self.entered = asyncio.Event()
        self.release = asyncio.Event()

    async def append_records(
        self, *, session_id: str, records: Sequence[Record], expected_offset: int
    ) -> None:
        if any(b'"kind":"tool_dispatched"' in r.data and self.marker in r.data for r in records):
            self.entered.set()
            await self.release.wait()
        await super().append_records(
            session_id=session_id, records=records, expected_offset=expected_offset
        )


async def test_a_cancellation_during_the_t1_commit_records_that_the_call_never_ran(
    tmp_path: Path,
) -> None:
    gates = Gates()
    store = GatedStore(SqliteLogStore(tmp_path / "state"), "c0-0")
    agent = make_agent(
        tmp_path, Batches([("poke", {"path": "a.txt", "tag": "t"})]), gates.tools(), store
    )
    turn = asyncio.create_task(agent.run("go", session="s1"))
    async with asyncio.timeout(5):
        await store.entered.wait()
    turn.cancel()
    await asyncio.sleep(0.01)
    store.release.set()  # the T1 append completes after the cancellation arrived
    with pytest.raises(asyncio.CancelledError):
        await turn
    assert gates.log == []  # past T1, but it never started ...
    events = await agent.session("s1").events()
    t2 = by_call(events, ToolResponded)["c0-0"].body
    assert t2.status == "cancelled" and "did not run" in t2.content  # type: ignore[union-attr]
    assert events[-1].kind == "run_ended"  # ... and the log stayed in step with memory
    await agent.close()


# ---------------------------------------------------------------- commit failures


class NthAppendOf:
    """A ``fail_when`` for ``FaultyLogStore``: fail the n-th append holding ``kind``."""

    def __init__(self, kind: str, n: int) -> None:
        self.marker = f'"kind":"{kind}"'.encode()
        self.n = n
        self.seen = 0
        self.failed = asyncio.Event()

    def __call__(self, records: Sequence[Record]) -> bool:
        if any(self.marker in r.data for r in records):
            self.seen += 1
            if self.seen == self.n:
                self.failed.set()
                return True
        return False

    async def wait(self) -> None:
        async with asyncio.timeout(5):
            await self.failed.wait()


async def test_a_t1_failure_mid_batch_freezes_queued_calls_and_lets_running_ones_settle(
    tmp_path: Path,
) -> None:
    gates = Gates()
    asked: list[str] = []

    async def approver(t: Tool, arguments: dict[str, Any]) -> bool:
        asked.append(arguments["tag"])
        if arguments["tag"] == "fails":
            # approved once "running" runs, so its T1 is a commit of its own (T1s that
            # arrive together are group-committed) and that commit fails
            await gates.seen("start:running")
            return True
        await asyncio.Event().wait()  # nobody answers
        return False

    second_t1 = NthAppendOf("tool_dispatched", 2)
    store = FaultyLogStore(SqliteLogStore(tmp_path / "state"), fail_when=second_t1)
    model = Batches(
        [
            ("risky", {"tag": "fails"}),
            ("poke", {"path": "a.txt", "tag": "running"}),
            ("risky", {"tag": "asking"}),  # waits for an approval that never comes
            ("poke", {"path": "a.txt", "tag": "queued"}),
        ]
    )
    agent = make_agent(tmp_path, model, gates.tools(), store, hooks=Hooks(approver=approver))
    turn = asyncio.create_task(agent.run("go", session="s1"))
    await gates.seen("start:running")
    assert asked[0] == "fails"
    await second_t1.wait()
    await asyncio.sleep(0.02)
    assert not turn.done()  # the running call has not settled yet
    gates.open["running"].set()
    with pytest.raises(CommitFailedError):
        async with asyncio.timeout(5):
            await turn
    assert gates.log == ["start:running", "end:running"]  # settled, not cancelled
    events = await agent.session("s1").events()
    assert [e.call_id for e in events if isinstance(e.body, ToolDispatched)] == ["c0-1"]
    assert not any(isinstance(e.body, ToolResponded) for e in events)  # nothing after failure
    assert all(not s.holders and not s.waiters for s in agent.authorities.statistics())
    await agent.close()


async def test_a_t2_failure_stops_queued_calls_from_dispatching(tmp_path: Path) -> None:
    gates = Gates()
    first_t2 = NthAppendOf("tool_responded", 1)
    store = FaultyLogStore(SqliteLogStore(tmp_path / "state"), fail_when=first_t2)
    model = Batches(
        [
            ("poke", {"path": "a.txt", "tag": "first"}),
            ("poke", {"path": "a.txt", "tag": "queued"}),
            ("peek", {"path": "b.txt", "tag": "running"}),
        ]
    )
    agent = make_agent(tmp_path, model, gates.tools(), store)
    turn = asyncio.create_task(agent.run("go", session="s1"))
    # "first" ends (and its T2 fails) only once "running" is past its T1: a tool that
    # finishes without waiting may otherwise reach its T2 before the others' T1s
    await gates.seen("start:first")
    await gates.seen("start:running")
    gates.open["first"].set()
    await gates.seen("end:first")
    await first_t2.wait()
    gates.open["running"].set()
    with pytest.raises(CommitFailedError):
        async with asyncio.timeout(5):
            await turn
    assert "start:queued" not in gates.log and "end:running" in gates.log
    events = await agent.session("s1").events()
    assert {e.call_id for e in events if isinstance(e.body, ToolDispatched)} == {"c0-0", "c0-2"}
    await agent.close()


# ---------------------------------------------------------------- claims at the boundary


async def test_a_bad_claim_is_a_rejection_not_a_crash(tmp_path: Path) -> None:
    @tool(claims=lambda arguments, ctx: ["file:a.txt"])  # type: ignore[arg-type,list-item]
    def legacy() -> str:
        """Declares its claims the old way."""
        return "ran"

    model = Batches(
        [
            ("read_file", {"path": "../outside.txt"}),
            ("legacy", {}),
            ("read_file", {"path": "a.txt"}),
        ]
    )
    agent = make_agent(tmp_path, model, [read_file, legacy])
    (tmp_path / "ws" / "a.txt").write_text("fine\n")
    assert (await agent.run("go", session="s1")).status == "completed"
    events = await agent.session("s1").events()
    rejected = by_call(events, CallRejected)
    assert rejected["c0-0"].body.reason == "invalid_arguments"  # type: ignore[union-attr]
    assert "outside the workspace" in rejected["c0-0"].body.message  # type: ignore[union-attr]
    assert rejected["c0-1"].body.reason == "claims_failed"  # type: ignore[union-attr]
    assert "fine" in by_call(events, ToolResponded)["c0-2"].body.content  # type: ignore[union-attr]
    assert not any(isinstance(e.body, PermissionRequested) for e in events)
    await agent.close()


async def test_the_runtime_reports_the_authorities_statistics(tmp_path: Path) -> None:
    agent = make_agent(tmp_path, Batches(), [])
    writer = await agent.log.open_writer("s2")
    journal = agent.engine.journal(writer, SessionState("s2", writer.initial_events))
    runtime = agent.engine.pipeline(agent.engine.run_context(journal, turn_id="t", run_id="r"))
    assert runtime.authorities is agent.authorities
    assert [s.authority for s in runtime.authority_stats()] == ["files", "actors", "capacity"]
    await writer.close()
    await agent.close()
