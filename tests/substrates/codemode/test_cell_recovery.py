"""Failures around cells: a failed commit inside a cell, a cancelled turn, and recovery of
an interrupted cell, which is never run again: its nested calls follow their own tools'
policies, then one ``cell_interrupted`` fact tells the model what each of them did."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Sequence
from pathlib import Path

import pytest
from cell_harness import Cells, make_agent

from lodger.errors import CommitFailedError, ResumeBlockedError
from lodger.events import Event, RecoveryObserved, ToolDispatched, ToolResponded
from lodger.storage import SqliteLogStore
from lodger.storage.logstore import Record
from lodger.testing import FaultyLogStore
from lodger.tools import Tool, tool


def tools(counts: dict[str, int], gate: asyncio.Event | None = None) -> list[Tool]:
    @tool(nestable=True, recovery="idempotent")
    async def add(a: int, b: int) -> int:
        """Add two integers (safe to run again)."""
        counts["add"] = counts.get("add", 0) + 1
        return a + b

    @tool(nestable=True)
    async def shout(text: str) -> str:
        """Upper-case a text (never run twice)."""
        counts["shout"] = counts.get("shout", 0) + 1
        if gate is not None:
            await gate.wait()
        return text.upper()

    return [add, shout]


class FailT2:
    """Fail (once) the append of the n-th T2 of the cell (``"cell"``) or of a nested call."""

    def __init__(self, which: str, n: int = 1) -> None:
        self.which, self.n = which, n
        self.seen = 0

    def __call__(self, records: Sequence[Record]) -> bool:
        for r in records:
            data = json.loads(r.data)
            if data["body"]["kind"] != "tool_responded":
                continue
            nested = data.get("parent_call_id") is not None
            if (self.which == "cell") == (not nested):
                self.seen += 1
                if self.seen == self.n:
                    return True
        return False


def dispatched(events: Sequence[Event], tool_name: str) -> list[Event]:
    return [e for e in events if isinstance(e.body, ToolDispatched) and e.body.tool == tool_name]


def settled(events: Sequence[Event]) -> dict[str, object]:
    found = [
        e
        for e in events
        if isinstance(e.body, RecoveryObserved) and e.body.reason == "cell_interrupted"
    ]
    assert len(found) == 1 and found[0].call_id == "cell0" and found[0].visibility == "model"
    return json.loads(found[0].body.observation)  # type: ignore[union-attr]


CELL = "const x = await tools.add({a: 1, b: 2});\nreturn await tools.shout({text: 'x' + x});"


async def test_an_interrupted_cell_is_settled_from_its_nested_outcomes_never_rerun(
    tmp_path: Path,
) -> None:
    counts: dict[str, int] = {}
    store = FaultyLogStore(SqliteLogStore(tmp_path / "state"), fail_when=FailT2("cell"))
    agent = make_agent(tmp_path, Cells(CELL), tools(counts), store=store)
    with pytest.raises(CommitFailedError):
        await agent.run("go", session="s")
    assert counts == {"add": 1, "shout": 1}

    model = Cells()  # the model, told what happened, just answers
    again = make_agent(tmp_path, model, tools(counts), store=SqliteLogStore(tmp_path / "state"))
    plan = await again.recovery_plan("s")
    cell = next(c for c in plan.calls if c.call_id == "cell0")
    assert (cell.status, cell.action) == ("indeterminate", "report")
    assert [c.status for c in plan.calls if c.parent_call_id == "cell0"] == ["completed"] * 2
    result = await again.resume("s")
    assert result.status == "completed"
    assert counts == {"add": 1, "shout": 1}  # nothing ran again
    events = await again.session("s").events()
    assert len(dispatched(events, "exec")) == 1
    report = settled(events)
    assert [(n["tool"], n["outcome"], n["result"]) for n in report["nested"]] == [  # type: ignore[index]
        ("add", "completed", "3"),
        ("shout", "completed", "X3"),
    ]
    # the model saw the cell's settlement as its result
    assert "interrupted" in json.dumps([repr(m) for m in model.requests[0].messages])
    replan = await again.recovery_plan("s")
    assert replan.turn_id is None


async def test_a_failed_nested_commit_stops_the_cell_and_recovery_reruns_only_idempotent(
    tmp_path: Path,
) -> None:
    counts: dict[str, int] = {}
    store = FaultyLogStore(SqliteLogStore(tmp_path / "state"), fail_when=FailT2("nested"))
    agent = make_agent(tmp_path, Cells(CELL), tools(counts), store=store)
    with pytest.raises(CommitFailedError):
        await agent.run("go", session="s")
    events = await agent.session("s").events()
    # add ran, its T2 failed: nothing after it started (no shout T1), the cell has no T2
    assert counts == {"add": 1}
    assert dispatched(events, "shout") == []
    assert not any(isinstance(e.body, ToolResponded) for e in events)

    again = make_agent(tmp_path, Cells(), tools(counts), store=SqliteLogStore(tmp_path / "state"))
    await again.resume("s")
    assert counts == {"add": 2}  # idempotent: re-run once under a linked T1
    events = await again.session("s").events()
    add_t1s = dispatched(events, "add")
    assert [e.body.attempt for e in add_t1s] == [1, 2]  # type: ignore[union-attr]
    assert add_t1s[1].body.retry_of == add_t1s[0].body.operation_id  # type: ignore[union-attr]
    assert add_t1s[1].visibility == "hidden" and add_t1s[1].parent_call_id == "cell0"
    report = settled(events)
    assert [(n["tool"], n["outcome"], n.get("attempts")) for n in report["nested"]] == [  # type: ignore[index]
        ("add", "completed", 2)
    ]
    assert len(dispatched(events, "exec")) == 1


async def test_a_parked_nested_call_holds_its_cell_until_decided(tmp_path: Path) -> None:
    counts: dict[str, int] = {}

    store = FaultyLogStore(SqliteLogStore(tmp_path / "state"), fail_when=FailT2("nested", 2))
    agent = make_agent(tmp_path, Cells(CELL), tools(counts), store=store)
    with pytest.raises(CommitFailedError):
        await agent.run("go", session="s")
    assert counts == {"add": 1, "shout": 1}

    again = make_agent(tmp_path, Cells(), tools(counts), store=SqliteLogStore(tmp_path / "state"))
    with pytest.raises(ResumeBlockedError) as blocked:
        await again.resume("s")
    shout_call = blocked.value.next_steps[0].call_id
    assert shout_call is not None and shout_call != "cell0"
    plan = await again.recovery_plan("s")
    by_id = {c.call_id: c for c in plan.calls}
    assert by_id["cell0"].status == "indeterminate"  # not settled while its nested call waits
    assert (by_id[shout_call].status, by_id[shout_call].parent_call_id) == ("parked", "cell0")

    await again.decide("s", shout_call, "completed", result="X3")
    result = await again.resume("s")
    assert result.status == "completed"
    assert counts == {"add": 1, "shout": 1}
    report = settled(await again.session("s").events())
    assert [(n["tool"], n["outcome"], n["result"]) for n in report["nested"]] == [  # type: ignore[index]
        ("add", "completed", "3"),
        ("shout", "completed", "X3"),
    ]


async def test_cancelling_the_turn_cancels_the_cell_and_settles_its_calls(tmp_path: Path) -> None:
    counts: dict[str, int] = {}
    gate = asyncio.Event()
    started = asyncio.Event()

    @tool(nestable=True)
    async def wait_here() -> str:
        """Block until released."""
        started.set()
        await gate.wait()
        return "released"

    agent = make_agent(
        tmp_path, Cells("return await tools.wait_here({});"), [*tools(counts), wait_here]
    )
    run = asyncio.ensure_future(agent.run("go", session="s"))
    await started.wait()
    run.cancel()
    with pytest.raises(asyncio.CancelledError):
        await run
    events = await agent.session("s").events()
    nested_t2 = [e for e in events if e.parent_call_id == "cell0" and e.kind == "tool_responded"]
    assert [e.body.status for e in nested_t2] == ["cancelled"]  # type: ignore[union-attr]
    cell_t2 = [e for e in events if e.call_id == "cell0" and e.kind == "tool_responded"]
    assert [e.body.status for e in cell_t2] == ["cancelled"]  # type: ignore[union-attr]
    assert events[-1].kind == "run_ended"
