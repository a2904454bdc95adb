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
from lodger.events import Event, SessionStarted, ToolDispatched, ToolResponded
from lodger.subagents import SubagentPolicy, child_session_id
from lodger.subagents.ledger import budget_from_metadata, tree_spend

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
    async with Agent(model=model, tools=[add], state_dir=tmp_path / "s", subagents=policy) as a:
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
    async with Agent(model=model, state_dir=tmp_path / "s", subagents=policy) as a:
        assert (await a.run("go", session="p")).status == "completed"
        first, forked = _delegate_calls(await a.log.read_all("p"))
        link = await a.log.read(child_session_id("p", forked), end=1)
        assert isinstance(link[0].body, SessionStarted) and link[0].body.parent is not None
        assert first != forked
        spend = await tree_spend(a.log, "p", policy=policy)
        assert (spend.children, spend.steps, spend.open_children) == (2, 2, 0)
