"""The delegate tool in one process, on real SQLite state: results, links, refusals,
concurrency, budgets, depth, approvals and cancellation."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
from subagent_world import routed

from lodger import Agent, tool
from lodger.engine.settings import Hooks
from lodger.events import (
    CallRejected,
    CancelRequested,
    Event,
    PermissionDecided,
    PermissionRequested,
    RunEnded,
    SessionStarted,
    ToolDispatched,
    ToolResponded,
    TurnEnded,
    Usage,
)
from lodger.providers.base import ModelRequest, ModelResponse
from lodger.providers.scripted import tool_call
from lodger.runtime.subagents import (
    Budget,
    SubagentLink,
    SubagentPolicy,
    child_session_id,
    current_subagent,
    link_of,
)
from lodger.tools.spec import Tool


@tool
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


def _delegate(task: str, **more: Any) -> dict[str, Any]:
    return {"name": "delegate", "args": {"task": task, **more}}


def _responses(events: list[Event]) -> dict[str, ToolResponded]:
    return {e.call_id or "": e.body for e in events if isinstance(e.body, ToolResponded)}


def _rejections(events: list[Event]) -> list[CallRejected]:
    return [e.body for e in events if isinstance(e.body, CallRejected)]


async def _sessions(agent: Agent) -> list[str]:
    return sorted(await agent.log.list_sessions())


async def test_a_delegation_runs_a_linked_child_whose_answer_is_the_result(
    tmp_path: Path,
) -> None:
    model = routed(
        {
            "sum it": [_step([_delegate("add 2 and 3", tools=["add"])]), {"text": "it is 5"}],
            "add 2 and 3": [_step([{"name": "add", "args": {"a": 2, "b": 3}}]), {"text": "5"}],
        }
    )
    async with Agent(
        model=model,
        tools=[add],
        storage=tmp_path / "s",
        subagents=SubagentPolicy(),
    ) as agent:
        result = await agent.run("sum it", session="p")
        assert result.status == "completed" and result.answer == "it is 5"
        parent = await agent.log.read_all("p")
        (t1,) = [e for e in parent if isinstance(e.body, ToolDispatched)]
        assert isinstance(t1.body, ToolDispatched) and t1.call_id is not None
        child_id = child_session_id("p", t1.call_id)
        # T1 names the child before it exists
        assert t1.body.resources == (f"actor:subagent:{child_id}",)
        assert t1.body.recovery == "queryable"
        body = json.loads(_responses(parent)[t1.call_id].content)
        assert body == {
            "session": child_id,
            "status": "completed",
            "answer": "5",
            "steps": 2,
            "tokens": 0,
        }
        child = await agent.log.read_all(child_id)
        first = child[0]
        assert isinstance(first.body, SessionStarted)
        assert first.body.parent is None  # history "empty": not a fork
        link = link_of(first)
        model_output = next(e for e in parent if e.kind == "model_output")
        assert link == SubagentLink(
            session_id=child_id,
            parent_session="p",
            parent_call=t1.call_id,
            parent_offset=model_output.offset + 1,
            parent_digest=model_output.digest,
            depth=1,
            root="p",
            history="empty",
        )
        # the first event is alone in its append: the child existed before its turn
        assert child[1].kind == "turn_started" and child[1].ts >= first.ts
        assert _responses(child)  # the child's add call, T1 and T2 in the child's log
        assert await _sessions(agent) == sorted(["p", child_id])


def _step(calls: list[dict[str, Any]], text: str = "") -> dict[str, Any]:
    return {"text": text, "calls": calls}


async def test_a_child_asking_for_a_tool_the_parent_lacks_is_refused(tmp_path: Path) -> None:
    model = routed(
        {
            "go": [
                _step([_delegate("x", tools=["add", "shell"])]),
                _step([_delegate("x", tools=["add"])]),
                {"text": "ok"},
            ],
            "x": [{"text": "did x"}],
        }
    )
    async with Agent(
        model=model,
        tools=[add],
        storage=tmp_path / "s",
        subagents=SubagentPolicy(),
    ) as agent:
        result = await agent.run("go", session="p")
        assert result.status == "completed"
        events = await agent.log.read_all("p")
        (refused,) = _rejections(events)
        assert refused.reason == "invalid_arguments"
        assert "'shell'" in refused.message and "Your tools: add, delegate" in refused.message
        # refused before dispatch: no child for it; the corrected call got one
        dispatched = [e for e in events if isinstance(e.body, ToolDispatched)]
        assert len(dispatched) == 1
        assert len(await _sessions(agent)) == 2


async def test_delegations_of_one_step_run_concurrently(tmp_path: Path) -> None:
    both = asyncio.Barrier(2)

    @tool
    async def meet() -> str:
        """Wait until the other subagent is here too."""
        async with asyncio.timeout(20):  # sequential children would never meet
            await both.wait()
        return "met"

    child = [_step([{"name": "meet", "args": {}}]), {"text": "met the other"}]
    model = routed(
        {
            "go": [_step([_delegate("a"), _delegate("b")]), {"text": "done"}],
            "a": child,
            "b": child,
        }
    )
    async with Agent(
        model=model,
        tools=[meet],
        storage=tmp_path / "s",
        subagents=SubagentPolicy(),
    ) as agent:
        result = await agent.run("go", session="p")
        assert result.status == "completed"
        results = [
            json.loads(r.content) for r in _responses(await agent.log.read_all("p")).values()
        ]
        assert [r["answer"] for r in results] == ["met the other", "met the other"]
        assert len({r["session"] for r in results}) == 2


async def test_depth_limit_refuses_a_child_delegating_past_it(tmp_path: Path) -> None:
    model = routed(
        {
            "go": [_step([_delegate("level 1")]), {"text": "done"}],
            "level 1": [_step([_delegate("level 2")]), {"text": "level 1 done"}],
            "level 2": [_step([_delegate("level 3")]), {"text": "level 2 done"}],
            "level 3": [{"text": "never"}],
        }
    )
    async with Agent(
        model=model,
        storage=tmp_path / "s",
        subagents=SubagentPolicy(max_depth=2),
    ) as agent:
        result = await agent.run("go", session="p")
        assert result.status == "completed"
        sessions = await _sessions(agent)
        assert len(sessions) == 3  # p, its child, its grandchild; never a third level
        links = {}
        for sid in sessions:
            link = link_of((await agent.log.read(sid, end=1))[0])
            if link is not None:
                links[link.depth] = link
        assert links[1].parent_session == "p" and links[2].parent_session == links[1].session_id
        assert links[2].root == "p"
        grandchild = await agent.log.read_all(links[2].session_id)
        (refused,) = _rejections(grandchild)
        assert "limited to depth 2" in refused.message


async def test_the_tree_budget_bounds_every_child_together(tmp_path: Path) -> None:
    two_steps = [_step([{"name": "add", "args": {"a": 1, "b": 1}}]), {"text": "2"}]
    model = routed(
        {
            "go": [
                _step([_delegate("first", budget={"steps": 5})]),
                _step([_delegate("second")]),
                {"text": "done"},
            ],
            "first": two_steps,
            "second": two_steps,
        }
    )
    policy = SubagentPolicy(tree_steps=2)
    async with Agent(model=model, tools=[add], storage=tmp_path / "s", subagents=policy) as a:
        result = await a.run("go", session="p")
        assert result.status == "completed"
        events = await a.log.read_all("p")
        (only,) = [json.loads(r.content) for r in _responses(events).values()]
        assert only["status"] == "completed" and only["steps"] == 2
        (refused,) = _rejections(events)
        assert "budget of this session tree is spent" in refused.message
        assert len(await _sessions(a)) == 2


async def test_a_child_stops_at_its_step_and_token_budgets(tmp_path: Path) -> None:
    def busy(request: ModelRequest) -> ModelResponse:
        return ModelResponse(calls=(tool_call("add", a=1, b=2),), usage=Usage(input_tokens=60))

    model = routed(
        {
            "go": [
                _step(
                    [
                        _delegate("by steps", budget={"steps": 2}),
                        _delegate("by tokens", budget={"tokens": 100}),
                    ]
                ),
                {"text": "done"},
            ],
            "by steps": busy,
            "by tokens": busy,
        }
    )
    async with Agent(
        model=model,
        tools=[add],
        storage=tmp_path / "s",
        subagents=SubagentPolicy(),
    ) as agent:
        await agent.run("go", session="p")
        results = sorted(
            (json.loads(r.content) for r in _responses(await agent.log.read_all("p")).values()),
            key=lambda r: str(r["status"]),
        )
        by_tokens, by_steps = results
        assert by_steps["status"] == "step_limit" and by_steps["steps"] == 2
        assert by_tokens["status"] == "failed" and by_tokens["steps"] == 2
        assert "token budget" in by_tokens["error"] and by_tokens["tokens"] == 120


async def test_a_child_past_its_wall_time_is_stopped_with_its_calls_settled(
    tmp_path: Path,
) -> None:
    @tool
    async def slow() -> str:
        """Takes long."""
        await asyncio.sleep(60)
        return "late"

    model = routed(
        {
            "go": [_step([_delegate("wait", budget={"wall_time_s": 0.3})]), {"text": "done"}],
            "wait": [_step([{"name": "slow", "args": {}}]), {"text": "never"}],
        }
    )
    async with Agent(
        model=model,
        tools=[slow],
        storage=tmp_path / "s",
        subagents=SubagentPolicy(),
    ) as agent:
        await agent.run("go", session="p")
        (result,) = [
            json.loads(r.content) for r in _responses(await agent.log.read_all("p")).values()
        ]
        assert result["status"] == "open" and "wall time (0.3 s)" in result["error"]
        child = await agent.log.read_all(result["session"])
        (t2,) = _responses(child).values()
        assert t2.status == "cancelled"
        assert isinstance(child[-1].body, RunEnded) and child[-1].body.status == "interrupted"


async def test_child_approvals_go_to_the_parents_approver_naming_the_child(
    tmp_path: Path,
) -> None:
    asked: list[tuple[str, str | None]] = []

    async def approver(t: Tool, arguments: dict[str, Any]) -> bool:
        child = current_subagent()
        asked.append((t.name, child.session_id if child else None))
        return True

    @tool(approval=True)
    def risky(n: int) -> str:
        """Needs approval."""
        return f"did {n}"

    model = routed(
        {
            "go": [_step([{"name": "risky", "args": {"n": 0}}, _delegate("r")]), {"text": "ok"}],
            "r": [_step([{"name": "risky", "args": {"n": 1}}]), {"text": "child did it"}],
        }
    )
    async with Agent(
        model=model,
        tools=[risky],
        storage=tmp_path / "s",
        hooks=Hooks(approver=approver),
        subagents=SubagentPolicy(),
    ) as agent:
        result = await agent.run("go", session="p")
        assert result.status == "completed"
        child_id = next(s for s in await _sessions(agent) if s != "p")
        assert sorted(asked, key=str) == sorted([("risky", None), ("risky", child_id)], key=str)
        child = await agent.log.read_all(child_id)
        assert any(isinstance(e.body, PermissionRequested) for e in child)
        (decided,) = [e.body for e in child if isinstance(e.body, PermissionDecided)]
        assert decided.decision == "allow" and decided.by == "user"


async def test_cancelling_the_parent_cancels_the_child_and_settles_its_calls(
    tmp_path: Path,
) -> None:
    started = asyncio.Event()

    @tool
    async def wait_forever() -> str:
        """Never ends by itself."""
        started.set()
        await asyncio.Event().wait()
        return "never"

    model = routed(
        {
            "go": [_step([_delegate("w")]), {"text": "never"}],
            "w": [_step([{"name": "wait_forever", "args": {}}]), {"text": "never"}],
        }
    )
    async with Agent(
        model=model,
        tools=[wait_forever],
        storage=tmp_path / "s",
        subagents=SubagentPolicy(),
    ) as agent:
        run = asyncio.create_task(agent.run("go", session="p"))
        await asyncio.wait_for(started.wait(), 20)
        run.cancel()
        with pytest.raises(asyncio.CancelledError):
            await run
        parent = await agent.log.read_all("p")
        (delegated,) = _responses(parent).values()
        assert delegated.status == "cancelled"
        child_id = next(s for s in await _sessions(agent) if s != "p")
        child = await agent.log.read_all(child_id)
        (waited,) = _responses(child).values()
        assert waited.status == "cancelled"
        ended = [e.body for e in child if isinstance(e.body, RunEnded)]
        assert [r.status for r in ended] == ["interrupted"]


async def test_the_policy_caps_what_a_delegation_asks_for(
    tmp_path: Path,
) -> None:
    policy = SubagentPolicy(max_budget=Budget(steps=1, wall_time=5.0))
    model = routed(
        {
            "go": [_step([_delegate("c", budget={"steps": 9}, history="fork")]), {"text": "ok"}],
            "c": [_step([{"name": "add", "args": {"a": 1, "b": 1}}]), {"text": "never"}],
        }
    )
    async with Agent(model=model, tools=[add], storage=tmp_path / "s", subagents=policy) as a:
        await a.run("go", session="p")
        (result,) = [json.loads(r.content) for r in _responses(await a.log.read_all("p")).values()]
        assert result["status"] == "step_limit" and result["steps"] == 1


async def test_a_childs_structured_output_is_the_result_and_a_bad_schema_is_refused(
    tmp_path: Path,
) -> None:
    schema = {
        "type": "object",
        "properties": {"sum": {"type": "integer"}},
        "required": ["sum"],
        "additionalProperties": False,
    }
    model = routed(
        {
            "go": [
                _step([_delegate("s", output_schema={"type": "nonsense"})]),
                _step([_delegate("s", output_schema=schema)]),
                {"text": "ok"},
            ],
            # a first answer that fails the schema goes back to the child, then a valid one
            "s": [{"text": '{"sum": "five"}'}, {"text": '```json\n{"sum": 5}\n```'}],
        }
    )
    async with Agent(model=model, storage=tmp_path / "s", subagents=SubagentPolicy()) as agent:
        await agent.run("go", session="p")
        events = await agent.log.read_all("p")
        (refused,) = _rejections(events)
        assert "output_schema is not a valid JSON schema" in refused.message
        (result,) = [json.loads(r.content) for r in _responses(events).values()]
        assert result["status"] == "completed"
        assert result["output"] == {"sum": 5} and "answer" not in result
        child = await agent.log.read_all(result["session"])
        assert [e.kind for e in child].count("output_rejected") == 1


async def test_a_cancel_of_the_parent_turn_ends_the_child_turn_cancelled(
    tmp_path: Path,
) -> None:
    """``Agent.cancel`` of the parent cascades: the child's running call settles, and
    its turn ends cancelled naming who cancelled the parent (a plain task cancel, above,
    leaves the child open for a resume instead)."""
    started = asyncio.Event()

    @tool
    async def wait_forever() -> str:
        """Never ends by itself."""
        started.set()
        await asyncio.Event().wait()
        return "never"

    model = routed(
        {
            "go": [_step([_delegate("w")]), {"text": "never"}],
            "w": [_step([{"name": "wait_forever", "args": {}}]), {"text": "never"}],
        }
    )
    async with Agent(
        model=model,
        tools=[wait_forever],
        storage=tmp_path / "s",
        subagents=SubagentPolicy(),
    ) as agent:
        run = asyncio.create_task(agent.run("go", session="p"))
        await asyncio.wait_for(started.wait(), 20)
        done = await agent.cancel("p", who="alice", reason="wrong plan")
        assert done.status == "cancelled"
        assert (await run).status == "cancelled"
        child_id = next(s for s in await _sessions(agent) if s != "p")
        child = await agent.log.read_all(child_id)
        await agent.log.verify(child_id)
        (waited,) = _responses(child).values()
        assert waited.status == "cancelled"
        kinds = [e.kind for e in child]
        assert kinds[-2:] == ["cancel_requested", "turn_ended"], kinds
        asked, ended = child[-2].body, child[-1].body
        assert isinstance(asked, CancelRequested) and asked.who == "alice"
        assert "its parent's turn was cancelled: wrong plan" in asked.reason
        assert isinstance(ended, TurnEnded) and ended.status == "cancelled"
        assert (await agent.cancel(child_id)).status == "not_running"  # nothing open
