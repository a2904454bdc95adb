"""Permission modes a person switches during a session: what each mode lets through, the
project's deny rules winning in every mode, and a switch applying from the next step."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from lodger import Agent, ScriptedModel, tool
from lodger.engine.control import CancelRequest
from lodger.errors import SessionNotFoundError, UsageError
from lodger.events import CallRejected, PermissionModeChanged, StepStarted, ToolResponded
from lodger.providers.base import ModelRequest, ModelResponse
from lodger.providers.scripted import FunctionModel, tool_call
from lodger.storage import Storage
from lodger.tools.files import write_file
from lodger.tools.policy import PermissionPolicy, Rule
from lodger.tools.spec import Tool


@tool
async def reader() -> str:
    """Reads something."""
    return "read"


@tool(writes=True)
async def writer() -> str:
    """Changes the world (not a file edit)."""
    return "wrote"


@tool(approval=True)
async def guarded() -> str:
    """A tool that itself says a person must allow it."""
    return "guarded ran"


TOOLS: list[Tool] = [reader, writer, guarded, write_file]
CALLS = [
    {"name": "reader", "args": {}},
    {"name": "writer", "args": {}},
    {"name": "guarded", "args": {}},
    {"name": "write_file", "args": {"path": "x.txt", "content": "hi"}},
]

# what each mode does with the four tools (policy without rules): ran / asked (the
# approver allowed it) / denied without asking
EXPECTED: dict[str | None, dict[str, str]] = {
    None: {"reader": "ran", "writer": "ran", "guarded": "asked", "write_file": "ran"},
    "plan": {"reader": "ran", "writer": "denied", "guarded": "denied", "write_file": "denied"},
    "ask": {"reader": "ran", "writer": "asked", "guarded": "asked", "write_file": "asked"},
    "accept_edits": {
        "reader": "ran",
        "writer": "asked",
        "guarded": "asked",
        "write_file": "ran",
    },
    "full_auto": {"reader": "ran", "writer": "ran", "guarded": "asked", "write_file": "ran"},
}


def _agent(tmp_path: Path, asked: list[str], rules: list[Rule] | None = None) -> Agent:
    ws = tmp_path / "ws"
    ws.mkdir(exist_ok=True)

    async def approver(t: Tool, arguments: dict[str, Any]) -> str:
        asked.append(t.name)
        return "once"

    from lodger.engine.settings import Hooks

    return Agent(
        model=ScriptedModel([{"calls": CALLS}, {"text": "done"}]),
        tools=TOOLS,
        workspace=ws,
        storage=Storage.local(tmp_path / "state"),
        permissions=PermissionPolicy(rules or []),
        hooks=Hooks(approver=approver),
    )


async def _outcomes(agent: Agent, session: str) -> dict[str, str]:
    events = await agent.session(session).events()
    names = {}
    for e in events:
        for c in getattr(e.body, "calls", ()):
            names[c.call_id] = c.name
    out: dict[str, str] = {}
    for e in events:
        if isinstance(e.body, ToolResponded) and e.body.status == "ok":
            out[names[e.call_id or ""]] = "ran"
        elif isinstance(e.body, CallRejected):
            out[names[e.call_id or ""]] = "denied"
    return out


async def _first_turn(agent: Agent, session: str) -> None:
    """A turn that makes the session exist (a mode is switched on a logged session)."""
    first = agent.engine.model
    agent.engine.model = ScriptedModel([{"text": "hello"}])
    await agent.run("hi", session=session)
    agent.engine.model = first


@pytest.mark.parametrize("mode", list(EXPECTED))
async def test_each_mode_lets_through_what_it_says(tmp_path: Path, mode: str | None) -> None:
    asked: list[str] = []
    async with _agent(tmp_path, asked) as agent:
        await _first_turn(agent, "s")
        if mode is not None:
            switched = await agent.set_permission_mode("s", mode, who="cli:alice")
            assert switched.status == "changed" and switched.mode == mode
        result = await agent.run("go", session="s")
        assert result.status == "completed"
        got = await _outcomes(agent, "s")
        expected = EXPECTED[mode]
        for name, what in expected.items():
            if what == "asked":
                assert name in asked and got[name] == "ran", (mode, name)
            else:
                assert name not in asked and got[name] == what, (mode, name)
        assert ((tmp_path / "ws" / "x.txt").exists()) == (expected["write_file"] != "denied")
        if mode == "plan":
            events = await agent.session("s").events()
            message = next(e.body.message for e in events if isinstance(e.body, CallRejected))
            assert "plan mode" in message and "read-only" in message


@pytest.mark.parametrize("mode", list(EXPECTED))
async def test_the_projects_deny_rules_win_in_every_mode(tmp_path: Path, mode: str | None) -> None:
    asked: list[str] = []
    rules = [Rule.parse("write_file", "deny"), Rule.parse("reader", "deny")]
    async with _agent(tmp_path, asked, rules) as agent:
        await _first_turn(agent, "s")
        if mode is not None:
            await agent.set_permission_mode("s", mode)
        await agent.run("go", session="s")
        got = await _outcomes(agent, "s")
        assert got["write_file"] == got["reader"] == "denied"
        assert "write_file" not in asked and "reader" not in asked
        assert not (tmp_path / "ws" / "x.txt").exists()


async def test_full_auto_allows_what_an_ask_rule_asks(tmp_path: Path) -> None:
    asked: list[str] = []
    async with _agent(tmp_path, asked, [Rule.parse("writer", "ask")]) as agent:
        await _first_turn(agent, "s")
        await agent.set_permission_mode("s", "full_auto")
        await agent.run("go", session="s")
        assert (await _outcomes(agent, "s"))["writer"] == "ran"
        assert "writer" not in asked


async def test_a_switch_applies_from_the_next_step_not_the_running_one(tmp_path: Path) -> None:
    """Switched to plan while step 0's call runs: step 0 keeps its mode, step 1's edit is
    refused, and the model reads why."""
    ws = tmp_path / "ws"
    ws.mkdir()
    running, release = asyncio.Event(), asyncio.Event()

    @tool
    async def pause() -> str:
        """Waits for the test."""
        running.set()
        await release.wait()
        return "paused"

    seen: list[str] = []
    answers = [
        ModelResponse(text="hello"),  # the first turn
        ModelResponse(calls=(tool_call("pause"),)),
        ModelResponse(calls=(tool_call("write_file", path="y.txt", content="no"),)),
    ]

    async def respond(request: ModelRequest) -> ModelResponse:
        if answers:
            return answers.pop(0)
        seen.append(str(request.messages[-1]))
        return ModelResponse(text="ok")

    agent = Agent(
        model=FunctionModel(respond),
        tools=[pause, write_file],
        workspace=ws,
        storage=Storage.local(tmp_path / "state"),
    )
    async with agent:
        await agent.run("hi", session="s")  # the session exists (0 steps of note)
        turn = asyncio.create_task(agent.run("go", session="s"))
        await running.wait()
        switched = await agent.set_permission_mode("s", "plan", who="lib")
        assert switched.status == "changed" and switched.previous is None
        again = await agent.set_permission_mode("s", "plan")
        assert again.status == "unchanged"  # nothing written twice
        release.set()
        assert (await turn).status == "completed"
        events = await agent.session("s").events()
        changes = [e for e in events if isinstance(e.body, PermissionModeChanged)]
        assert len(changes) == 1 and changes[0].body.who == "lib"
        steps = [e for e in events if isinstance(e.body, StepStarted)]
        state = agent._states["s"]
        running_step, next_step = steps[-3], steps[-2]
        assert running_step.offset < changes[0].offset < next_step.offset
        assert state.permission_mode == state.mode_of_step(next_step.step_id) == "plan"
        rejected = [e for e in events if isinstance(e.body, CallRejected)]
        assert len(rejected) == 1 and rejected[0].step_id == next_step.step_id
        assert not (ws / "y.txt").exists()
        assert "plan mode" in seen[-1]


async def test_a_mode_needs_a_logged_session_and_a_known_name(tmp_path: Path) -> None:
    async with _agent(tmp_path, []) as agent:
        with pytest.raises(SessionNotFoundError):
            await agent.set_permission_mode("new", "plan")
        await _first_turn(agent, "s")
        with pytest.raises(UsageError) as caught:
            await agent.set_permission_mode("s", "yolo")
        assert caught.value.code == "permission_mode"
        assert (await agent.cancel("s", who="x")).status == "not_running"
        assert CancelRequest().reason == ""


async def test_plan_mode_refuses_a_delegation(tmp_path: Path) -> None:
    """A subagent's session runs tools under no mode of its parent's: in plan mode the
    delegation itself is refused (no child session is made)."""
    from lodger.runtime.subagents import SubagentPolicy

    script = [
        {"calls": [{"name": "delegate", "args": {"task": "write x.txt"}}]},
        {"text": "done"},
    ]
    async with Agent(
        model=ScriptedModel(script),
        tools=[reader],
        storage=tmp_path / "state",
        subagents=SubagentPolicy(),
    ) as agent:
        await _first_turn(agent, "p")
        await agent.set_permission_mode("p", "plan")
        await agent.run("go", session="p")
        events = await agent.session("p").events()
        (refused,) = [e.body for e in events if isinstance(e.body, CallRejected)]
        assert refused.tool == "delegate" and "plan mode" in refused.message
        assert await agent.log.list_sessions() == ["p"]  # no child session was made
