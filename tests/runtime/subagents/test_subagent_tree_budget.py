"""The tree budget is read from the tree's logs: it holds after a SIGKILL and resume of
the parent (a fresh process knows nothing in memory), concurrent delegations of one step
share it, and a forked child counts once."""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

from subagent_world import routed
from tree_budget_world import TREE_STEPS, budget_agent

from lodger import Agent, tool
from lodger.events import Event, EventDraft, SessionStarted, ToolDispatched, ToolResponded
from lodger.runtime.subagents import SubagentLink, SubagentPolicy, child_session_id
from lodger.runtime.subagents.ledger import budget_from_metadata, tree_spend
from lodger.storage import open_log

WORLD = Path(__file__).with_name("tree_budget_world.py")


@tool
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


def _delegate(task: str, **more: Any) -> dict[str, Any]:
    return {"name": "delegate", "args": {"task": task, **more}}


def _results(events: list[Event]) -> dict[str, ToolResponded]:
    return {e.call_id or "": e.body for e in events if isinstance(e.body, ToolResponded)}


def _delegate_calls(events: list[Event]) -> list[str]:
    return [
        e.call_id or ""
        for e in events
        if isinstance(e.body, ToolDispatched) and e.body.tool == "delegate"
    ]


def _crash(state: Path) -> None:
    proc = subprocess.run(
        [sys.executable, str(WORLD), str(state), "crash"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == -signal.SIGKILL, proc.stderr


async def test_a_resumed_parent_cannot_delegate_past_what_its_tree_spent_before_the_kill(
    tmp_path: Path,
) -> None:
    state = tmp_path / "state"
    await asyncio.to_thread(_crash, state)
    async with budget_agent(state, "none") as agent:
        before = await agent.log.read_all("parent-1")
        (first_call,) = _delegate_calls(before)
        first = json.loads(_results(before)[first_call].content)
        assert first["status"] == "completed" and first["steps"] == TREE_STEPS
        assert before[-1].body.kind == "tool_dispatched"  # killed inside hold, after T1
        result = await agent.resume("parent-1")
        assert result.status == "completed", result.error
        assert result.answer == "parent done"
        events = await agent.log.read_all("parent-1")
        first_call_again, second_call = _delegate_calls(events)
        assert first_call_again == first_call
        refused = _results(events)[second_call]
        # a tool error the model reads and works past: nothing ran for it
        assert refused.status == "error"
        assert "budget of this session tree is spent" in refused.content
        second = child_session_id("parent-1", second_call)
        assert not await agent.log.exists(second)
        assert sorted(await agent.log.list_sessions()) == sorted(
            ["parent-1", child_session_id("parent-1", first_call)]
        )
        spend = await tree_spend(agent.log, "parent-1", policy=agent.subagents)  # type: ignore[arg-type]
        assert (spend.steps, spend.children, spend.open_children) == (TREE_STEPS, 1, 0)


async def test_delegations_of_one_step_share_the_tree_budget_and_record_their_grants(
    tmp_path: Path,
) -> None:
    three_steps = [
        {"calls": [{"name": "add", "args": {"a": 1, "b": 1}}]},
        {"calls": [{"name": "add", "args": {"a": 2, "b": 2}}]},
        {"text": "4"},
    ]
    model = routed(
        {
            "go": [
                {
                    "calls": [
                        _delegate("a", budget={"steps": 2}),
                        _delegate("b", budget={"steps": 2}),
                    ]
                },
                {"text": "done"},
            ],
            "a": list(three_steps),
            "b": list(three_steps),
        }
    )
    policy = SubagentPolicy(tree_steps=3)
    async with Agent(model=model, tools=[add], storage=tmp_path / "s", subagents=policy) as a:
        assert (await a.run("go", session="p")).status == "completed"
        events = await a.log.read_all("p")
        calls = _delegate_calls(events)
        grants = []
        spent = 0
        for call in calls:
            child = await a.log.read_all(child_session_id("p", call))
            granted = budget_from_metadata(child[0])
            assert granted is not None
            grants.append(granted.steps)
            answer = json.loads(_results(events)[call].content)
            assert answer["steps"] <= granted.steps
            spent += answer["steps"]
        # one got what it asked, the other what was left; never more than the tree
        assert sorted(grants) == [1, 2]
        assert spent == 3
        spend = await tree_spend(a.log, "p", policy=policy)
        assert (spend.steps, spend.settled_steps, spend.children) == (3, 3, 2)


async def test_a_forked_child_and_an_empty_one_each_count_once(tmp_path: Path) -> None:
    model = routed(
        {
            "go": [
                {"calls": [_delegate("empty one")]},
                {"calls": [_delegate("forked one", history="fork")]},
                {"text": "done"},
            ],
            "empty one": [{"text": "a"}],
            "forked one": [{"text": "b"}],
        }
    )
    policy = SubagentPolicy(tree_steps=10)
    async with Agent(model=model, storage=tmp_path / "s", subagents=policy) as a:
        assert (await a.run("go", session="p")).status == "completed"
        first, forked = _delegate_calls(await a.log.read_all("p"))
        link = await a.log.read(child_session_id("p", forked), end=1)
        assert isinstance(link[0].body, SessionStarted) and link[0].body.parent is not None
        assert first != forked
        spend = await tree_spend(a.log, "p", policy=policy)
        assert (spend.children, spend.steps, spend.open_children) == (2, 2, 0)


async def _write(log: Any, session: str, bodies: list[tuple[Any, str | None]]) -> None:
    async with await log.open_writer(session) as writer:
        drafts = [
            EventDraft(id=f"{session}-{n}", ts=n, body=body, call_id=call)
            for n, (body, call) in enumerate(bodies)
        ]
        await writer.append(drafts, expected_offset=0)


def _link(session: str, parent: str) -> dict[str, str]:
    return SubagentLink(
        session_id=session,
        parent_session=parent,
        parent_call="c",
        parent_offset=1,
        parent_digest="0" * 64,
        depth=1,
        root=parent,
        history="empty",
    ).to_metadata()


def _t1(child: str, steps: int) -> ToolDispatched:
    return ToolDispatched(
        operation_id=f"op-{child}",
        tool="delegate",
        arguments={"task": "t", "budget": {"steps": steps}},
        resources=(f"actor:subagent:{child}",),
    )


async def test_damaged_or_foreign_child_records_are_counted_conservatively_or_not_at_all(
    tmp_path: Path,
) -> None:
    log = open_log(tmp_path / "s")
    try:
        await _write(
            log,
            "r",
            [
                (SessionStarted(), None),
                (_t1("kid-garbled", 4), "c1"),  # its grant record is not JSON
                (_t1("kid-negative", 6), "c2"),  # its grant record is negative
                (_t1("kid-old", 7), "c3"),  # written before grants were recorded
                (_t1("kid-foreign", 9), "c4"),  # its link names another parent
                (_t1("kid-missing", 9), "c5"),  # never wrote its first event
                (_t1("r", 9), "c6"),  # names the root itself: no link, no count
            ],
        )
        garbled = _link("kid-garbled", "r") | {"subagent.budget": "{not json"}
        negative = _link("kid-negative", "r") | {"subagent.budget": '{"steps": -5}'}
        await _write(log, "kid-garbled", [(SessionStarted(metadata=garbled), None)])
        await _write(log, "kid-negative", [(SessionStarted(metadata=negative), None)])
        await _write(log, "kid-old", [(SessionStarted(metadata=_link("kid-old", "r")), None)])
        foreign = _link("kid-foreign", "elsewhere")
        await _write(log, "kid-foreign", [(SessionStarted(metadata=foreign), None)])
        first = (await log.read("kid-negative", end=1))[0]
        assert budget_from_metadata(first) is None
        spend = await tree_spend(log, "r", policy=SubagentPolicy())
        # open children count what their T1s asked (capped by max_budget: 50 steps)
        assert (spend.children, spend.open_children, spend.steps) == (3, 3, 4 + 6 + 7)
        assert spend.settled_steps == 0
    finally:
        await log.close()
