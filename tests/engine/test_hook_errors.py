"""A hook of the developer's that raises fails the turn, naming the hook; it is never an
error result the model is asked to fix. Real SQLite state, scripted model.

Each case also checks what the log holds after: the step's other calls settled, a call
whose before-call hook raised never reached T1, a call whose after-call hook raised has
its T2 (it ran) with the result withheld, and the log verifies.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from lodger.engine.hooks import CallInfo, CallResult
from lodger.engine.settings import Hooks
from lodger.errors import HookError
from lodger.events import CallRejected, ModelOutput, ToolDispatched, ToolResponded, TurnEnded
from lodger.providers.scripted import ScriptedModel
from lodger.runtime.agent import Agent
from lodger.tools import tool

# One step with two calls, then an answer the turn must never reach.
SCRIPT = [
    {
        "calls": [
            {"name": "charge", "args": {"amount": 5}},
            {"name": "note", "args": {"text": "hello"}},
        ]
    },
    {"text": "done"},
]


def _tools(ran: list[str]) -> list:
    @tool
    def charge(amount: int) -> str:
        """Charge an amount."""
        ran.append(f"charge {amount}")
        return f"charged {amount}"

    @tool
    def note(text: str) -> str:
        """Write a note."""
        ran.append(f"note {text}")
        return "noted"

    return [charge, note]


def guard_charges(call: CallInfo) -> None:
    if call.tool == "charge":
        raise KeyError("amount_limit")  # the developer's bug
    return None


def redact(call: CallInfo, result: CallResult) -> str | None:
    if call.tool == "charge":
        raise ValueError("redactor broke")
    return None


async def _settled(agent: Agent, session_id: str) -> tuple[list, str]:
    events = await agent.session(session_id).events()
    await agent.session(session_id).verify()  # the log is whole after the failure
    ended = [e.body for e in events if isinstance(e.body, TurnEnded)]
    assert len(ended) == 1 and ended[0].status == "failed"
    return events, ended[0].answer or ""


async def test_a_before_call_hook_that_raises_fails_the_turn_naming_the_hook(
    tmp_path: Path,
) -> None:
    ran: list[str] = []
    async with Agent(
        model=ScriptedModel(SCRIPT),
        tools=_tools(ran),
        storage=tmp_path / "state",
        hooks=Hooks(before_call=[guard_charges]),
    ) as agent:
        with pytest.raises(HookError) as caught:
            await agent.run("pay", session="s1")
        error = caught.value
        assert error.hook.endswith("guard_charges") and error.tool == "charge"
        assert "guard_charges" in error.message and "KeyError" in error.message
        assert isinstance(error.__cause__, KeyError)
        events, _ = await _settled(agent, "s1")
    # the call it raised on never reached T1; its sibling ran and settled
    assert ran == ["note hello"]
    dispatched = [e.body.tool for e in events if isinstance(e.body, ToolDispatched)]
    assert dispatched == ["note"]
    rejected = [e.body for e in events if isinstance(e.body, CallRejected)]
    assert [r.tool for r in rejected] == ["charge"]
    assert "guard_charges" in rejected[0].message
    # the model was not asked to fix the developer's bug
    assert sum(isinstance(e.body, ModelOutput) for e in events) == 1


async def test_an_after_call_hook_that_raises_fails_the_turn_and_withholds_the_result(
    tmp_path: Path,
) -> None:
    ran: list[str] = []
    async with Agent(
        model=ScriptedModel(SCRIPT),
        tools=_tools(ran),
        storage=tmp_path / "state",
        hooks=Hooks(after_call=[redact]),
    ) as agent:
        with pytest.raises(HookError) as caught:
            await agent.run("pay", session="s2")
        assert caught.value.hook.endswith("redact")
        assert isinstance(caught.value.__cause__, ValueError)
        events, _ = await _settled(agent, "s2")
    assert sorted(ran) == ["charge 5", "note hello"]  # each ran once
    responded = {
        e.call_id: e.body for e in events if isinstance(e.body, ToolResponded)
    }  # both calls have their T2: nothing is left indeterminate
    assert len(responded) == 2
    charge = next(b for b in responded.values() if "charge" in b.content)
    assert charge.status == "error" and "withheld" in charge.content
    assert "charged 5" not in charge.content  # what the broken redactor should have seen
    assert sum(isinstance(e.body, ModelOutput) for e in events) == 1


async def test_a_hook_that_does_not_raise_leaves_the_turn_alone(tmp_path: Path) -> None:
    ran: list[str] = []
    async with Agent(
        model=ScriptedModel(SCRIPT),
        tools=_tools(ran),
        storage=tmp_path / "state",
        hooks=Hooks(before_call=[lambda call: None], after_call=[lambda call, result: None]),
    ) as agent:
        result = await agent.run("pay", session="s3")
    assert result.status == "completed" and result.answer == "done"
