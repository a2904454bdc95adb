"""An approver's "always" is a durable fact of the session: later asks for the same tool
are allowed without asking, in the same run, a later turn, and a resumed run (another
agent on the same SQLite log, with nobody to ask); never past a deny rule."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from lodger import Agent, tool
from lodger.engine.permissions import ALWAYS_REASON, Answered
from lodger.engine.settings import Hooks
from lodger.events import PermissionDecided, PermissionRequested, ToolResponded
from lodger.providers import ScriptedModel
from lodger.providers.base import ModelRequest, ModelResponse
from lodger.providers.scripted import FunctionModel, tool_call
from lodger.tools.policy import PermissionPolicy, Rule
from lodger.tools.spec import Tool

RAN: list[str] = []


@tool(approval=True)
def deploy(target: str) -> str:
    """Deploy to a target."""
    RAN.append(target)
    return f"deployed {target}"


@tool(approval=True)
def wipe(target: str) -> str:
    """Wipe a target."""
    RAN.append(f"wipe {target}")
    return f"wiped {target}"


class Asker:
    """An approver that answers from a list and records what it was asked."""

    def __init__(self, *answers: Any) -> None:
        self.answers = list(answers)
        self.asked: list[tuple[str, dict[str, Any]]] = []

    async def __call__(self, t: Tool, arguments: dict[str, Any]) -> Any:
        self.asked.append((t.name, arguments))
        return self.answers.pop(0)


def calls(*targets: str, name: str = "deploy") -> dict[str, Any]:
    return {"calls": [{"name": name, "args": {"target": t}} for t in targets]}


def agent(tmp_path: Path, model: Any, approver: Any, **kw: Any) -> Agent:
    return Agent(
        model=model,
        tools=[deploy, wipe],
        storage=tmp_path / "state",
        hooks=Hooks(approver=approver),
        **kw,
    )


async def decisions(a: Agent, session: str) -> list[tuple[str, str, str, str]]:
    return [
        (e.body.tool, e.body.decision, e.body.by, e.body.reason)
        for e in await a.session(session).events()
        if isinstance(e.body, PermissionDecided)
    ]


async def test_once_asks_again_always_does_not_and_deny_refuses(tmp_path: Path) -> None:
    RAN.clear()
    asker = Asker("once", "always", "deny")
    script = [calls("a"), calls("b"), calls("c"), calls("w", name="wipe"), {"text": "ok"}]
    async with agent(tmp_path, ScriptedModel(script), asker) as a:
        result = await a.run("go", session="s1")
        assert result.status == "completed"
        # asked for a (once), b (always), and wipe (another tool: asked, denied); not for c
        assert [name for name, _ in asker.asked] == ["deploy", "deploy", "wipe"]
        assert RAN == ["a", "b", "c"]
        made = await decisions(a, "s1")
        assert made[0] == ("deploy", "allow", "user", "")
        assert made[1] == ("deploy", "allow", "user", ALWAYS_REASON)
        assert made[2][:3] == ("deploy", "allow", "user")
        assert made[2][3].startswith("allowed always for this session (offset ")
        assert made[3] == ("wipe", "deny", "user", "")


async def test_always_holds_for_a_later_turn_and_a_non_interactive_agent(
    tmp_path: Path,
) -> None:
    RAN.clear()
    model = ScriptedModel(turns=[[calls("a"), {"text": "1"}], [calls("b"), {"text": "2"}]])
    async with agent(tmp_path, model, Asker("always")) as a:
        await a.run("one", session="s1")
    # another agent, nobody to ask (approver None denies asks): the log's fact allows it
    async with agent(tmp_path, model, None) as b:
        second = await b.run("two", session="s1")
        assert second.status == "completed"
        assert RAN == ["a", "b"]
        last = (await decisions(b, "s1"))[-1]
        assert last[:3] == ("deploy", "allow", "user") and "always" in last[3]


async def test_always_never_overrides_a_deny_rule(tmp_path: Path) -> None:
    RAN.clear()
    policy = PermissionPolicy(
        [Rule(pattern="deploy", decision="deny", arguments="prod*")], approve_all=False
    )
    script = [calls("staging"), calls("prod-1"), {"text": "ok"}]
    async with agent(tmp_path, ScriptedModel(script), Asker("always"), permissions=policy) as a:
        await a.run("go", session="s1")
        assert RAN == ["staging"]
        assert (await decisions(a, "s1"))[-1] == (
            "deploy",
            "deny",
            "policy",
            "rule 'deploy(prod*)'",
        )


async def test_parallel_asks_for_one_tool_ask_once_when_answered_always(tmp_path: Path) -> None:
    RAN.clear()
    asker = Asker("always")
    async with agent(tmp_path, ScriptedModel([calls("a", "b", "c"), {"text": "ok"}]), asker) as a:
        await a.run("go", session="s1")
        assert len(asker.asked) == 1 and sorted(RAN) == ["a", "b", "c"]
        events = await a.session("s1").events()
        # every call asked (a request fact each), one question reached the approver
        assert sum(isinstance(e.body, PermissionRequested) for e in events) == 3


async def test_a_resumed_run_honours_always(tmp_path: Path) -> None:
    RAN.clear()
    blocked = asyncio.Event()

    async def first(request: ModelRequest) -> ModelResponse:
        if not any(getattr(m, "call_id", None) for m in request.messages):
            return ModelResponse(calls=(tool_call("deploy", target="a"),))
        blocked.set()
        await asyncio.Event().wait()  # the process "dies" here: the task is cancelled
        raise AssertionError("unreachable")

    async with agent(tmp_path, FunctionModel(first), Asker("always")) as a:
        task = asyncio.create_task(a.run("go", session="s1"))
        await blocked.wait()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    def second(request: ModelRequest) -> ModelResponse | str:
        done = [m for m in request.messages if getattr(m, "call_id", None)]
        if len(done) < 2:
            return ModelResponse(calls=(tool_call("deploy", target="b"),))
        return "both deployed"

    async with agent(tmp_path, FunctionModel(second), None) as b:
        resumed = await b.resume("s1")
        assert resumed.status == "completed", resumed.error
        assert RAN == ["a", "b"]
        events = await b.session("s1").events()
        responded = [e.body.content for e in events if isinstance(e.body, ToolResponded)]
        assert responded == ["deployed a", "deployed b"]
        last = (await decisions(b, "s1"))[-1]
        assert last[:3] == ("deploy", "allow", "user") and "always" in last[3]


async def test_every_decision_says_who_decided(tmp_path: Path) -> None:
    """``permission_decided.who``: the rule when the policy decides, whoever the approver
    says answered (``Answered``), nobody for a bare answer."""
    RAN.clear()
    policy = PermissionPolicy(
        [
            Rule(pattern="wipe", decision="deny", arguments="prod*"),
            Rule.parse("deploy(ci-*)", "allow"),
        ]
    )
    script = [
        calls("prod", name="wipe"),
        calls("ci-1"),
        calls("staging"),
        calls("dev"),
        {"text": "ok"},
    ]
    approver = Asker(Answered("once", "cli:alice"), "deny")
    async with agent(tmp_path, ScriptedModel(script), approver, permissions=policy) as a:
        await a.run("go", session="s1")
        events = await a.session("s1").events()
    decided = [
        (e.body.tool, e.body.decision, e.body.by, e.body.who)
        for e in events
        if isinstance(e.body, PermissionDecided)
    ]
    assert decided == [
        ("wipe", "deny", "policy", "rule 'wipe(prod*)'"),
        ("deploy", "allow", "policy", "rule 'deploy(ci-*)'"),
        ("deploy", "allow", "user", "cli:alice"),
        ("deploy", "deny", "user", None),
    ]
    assert RAN == ["ci-1", "staging"]
