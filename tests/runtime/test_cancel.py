"""Cancel a running turn through the library: a sandboxed command (real bubblewrap) is
killed and recorded cancelled, a call queued behind it never starts, the turn and run end
cancelled; a second cancel, and a cancel of an idle or unknown session, write nothing."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from lodger import Agent, ScriptedModel
from lodger.events import CancelRequested, RunEnded, ToolDispatched, ToolResponded, TurnEnded
from lodger.runtime.builtin import workspace_tools
from lodger.runtime.streaming import TurnFinished
from lodger.storage import Storage

SLOW = "touch started; sleep 30; touch after"


def _script() -> ScriptedModel:
    return ScriptedModel(
        [
            {
                "calls": [
                    {"name": "shell", "args": {"command": SLOW}},
                    {"name": "shell", "args": {"command": "touch second"}},
                ]
            },
            {"text": "never reached"},
        ]
    )


async def _when(path: Path) -> None:
    """Wait until ``path`` exists (the sandboxed command said it started)."""
    async with asyncio.timeout(30):
        while not await asyncio.to_thread(path.exists):  # noqa: ASYNC110 - bwrap makes it
            await asyncio.sleep(0.02)


def _agent(tmp_path: Path) -> Agent:
    ws = tmp_path / "ws"
    ws.mkdir(exist_ok=True)
    return Agent(
        model=_script(),
        tools=workspace_tools(),
        workspace=ws,
        storage=Storage.local(tmp_path / "state"),
    )


def check_cancelled_log(events: list[object], ws: Path) -> None:
    """The facts a cancel during the sandboxed command leaves (shared with the CLI and
    host tests)."""
    kinds = [e.kind for e in events]  # type: ignore[attr-defined]
    # a turn with a workspace ends with its snapshot, committed with the cancel
    assert kinds[-4:] == ["cancel_requested", "workspace_snapshot", "run_ended", "turn_ended"], (
        kinds
    )
    ended = [e.body for e in events if isinstance(e.body, RunEnded)]  # type: ignore[attr-defined]
    assert ended[-1].status == "cancelled"
    turn = [e.body for e in events if isinstance(e.body, TurnEnded)]  # type: ignore[attr-defined]
    assert turn[-1].status == "cancelled"
    dispatched = [e for e in events if isinstance(e.body, ToolDispatched)]  # type: ignore[attr-defined]
    responded = {
        e.call_id: e.body  # type: ignore[attr-defined]
        for e in events
        if isinstance(e.body, ToolResponded)  # type: ignore[attr-defined]
    }
    # every call past T1 settled, and the slow one was stopped while it ran
    assert dispatched and all(d.call_id in responded for d in dispatched)
    first = dispatched[0]
    assert responded[first.call_id].status == "cancelled"
    # the queued call never ran: not dispatched, or settled cancelled before it started
    for d in dispatched[1:]:
        assert responded[d.call_id].status == "cancelled"
    assert not (ws / "after").exists()  # the sleep was killed
    assert not (ws / "second").exists()  # the queued call never started
    assert sum(isinstance(e.body, CancelRequested) for e in events) == 1  # type: ignore[attr-defined]


async def test_cancel_during_a_sandboxed_command_settles_and_records_it(tmp_path: Path) -> None:
    agent = _agent(tmp_path)
    ws = tmp_path / "ws"
    async with agent:
        turn = asyncio.create_task(agent.run("go", session="s1"))
        await _when(ws / "started")
        first, second = await asyncio.gather(
            agent.cancel("s1", who="cli:alice", reason="wrong task"),
            agent.cancel("s1", who="cli:bob"),
        )
        result = await turn
        assert result.status == "cancelled"
        assert {first.status, second.status} == {"cancelled", "already_cancelling"}
        events = await agent.session("s1").events()
        check_cancelled_log(events, ws)
        body = next(e.body for e in events if isinstance(e.body, CancelRequested))
        assert body.who == "cli:alice" and body.reason == "wrong task"
        assert events[-1].body.reason == "wrong task"  # type: ignore[union-attr]
        await agent.session("s1").verify()
        # idle now: a cancel answers so and writes nothing
        again = await agent.cancel("s1")
        assert again.status == "not_running"
        assert len(await agent.session("s1").events()) == len(events)
        assert (await agent.cancel("nobody")).status == "unknown_session"


async def test_cancel_on_the_stream_handle(tmp_path: Path) -> None:
    agent = _agent(tmp_path)
    ws = tmp_path / "ws"
    async with agent, agent.stream("go", session="s2") as stream:
        seen = []
        async for item in stream:
            if isinstance(item, TurnFinished):
                seen.append(item.result.status)
                break
            if item.__class__.__name__ == "FactCommitted" and item.event.kind == "tool_dispatched":  # type: ignore[union-attr]
                await _when(ws / "started")
                outcome = await stream.cancel(who="lib", reason="enough")
                assert outcome.status == "cancelled"
        assert seen == ["cancelled"]
        check_cancelled_log(await agent.session("s2").events(), ws)


async def test_a_cancel_before_the_turn_drives_ends_it_before_any_request(
    tmp_path: Path,
) -> None:
    """Asked as the turn starts (before its first step), the turn ends without asking
    the model: the request is read when the engine starts driving."""
    agent = _agent(tmp_path)
    async with agent:
        turn = asyncio.create_task(agent.run("go", session="s3"))
        while agent.turns.get("s3") is None:  # noqa: ASYNC110 - registered as it starts
            await asyncio.sleep(0)
        outcome = await agent.cancel("s3")
        assert outcome.status == "cancelled"
        assert (await turn).status == "cancelled"
        kinds = [e.kind for e in await agent.session("s3").events()]
        assert "step_started" not in kinds
        # a turn with a workspace ends with its snapshot, committed with the cancel
        assert kinds[-4:] == ["cancel_requested", "workspace_snapshot", "run_ended", "turn_ended"]


async def test_ctrl_c_still_leaves_the_turn_open(tmp_path: Path) -> None:
    """A plain stop from outside (no cancel request) keeps today's meaning: the run ends
    interrupted and the turn stays open for a resume."""
    agent = _agent(tmp_path)
    ws = tmp_path / "ws"
    async with agent:
        turn = asyncio.create_task(agent.run("go", session="s4"))
        await _when(ws / "started")
        turn.cancel()
        with pytest.raises(asyncio.CancelledError):
            await turn
        events = await agent.session("s4").events()
        assert events[-1].kind == "run_ended"
        assert events[-1].body.status == "interrupted"  # type: ignore[union-attr]
        assert not any(isinstance(e.body, CancelRequested) for e in events)


async def test_cancel_while_the_model_answers(tmp_path: Path) -> None:
    """Stopped during the model request: nothing was proposed, so nothing runs; the
    step's start is kept and the turn ends cancelled."""
    from lodger.providers.base import ModelRequest, ModelResponse
    from lodger.providers.scripted import FunctionModel

    asked, never = asyncio.Event(), asyncio.Event()

    async def respond(request: ModelRequest) -> ModelResponse:
        asked.set()
        await never.wait()
        raise AssertionError("not reached")

    agent = Agent(model=FunctionModel(respond), storage=Storage.local(tmp_path / "state"))
    async with agent:
        turn = asyncio.create_task(agent.run("go", session="m"))
        await asyncio.wait_for(asked.wait(), 30)
        outcome = await agent.cancel("m", who="lib")
        assert (outcome.status, outcome.turn_status) == ("cancelled", "cancelled")
        assert (await turn).status == "cancelled"
        kinds = [e.kind for e in await agent.session("m").events()]
        assert kinds == [
            "session_started", "turn_started", "run_started", "step_started",
            "cancel_requested", "run_ended", "turn_ended",
        ]  # fmt: skip


async def test_a_cancel_as_the_turn_ends_writes_no_second_end(tmp_path: Path) -> None:
    """A cancel that arrives while the turn's end commits comes too late: the turn ended
    as it did, nothing of the cancel is written, and the answer says so."""
    from lodger.engine.control import CancelRequest
    from lodger.engine.settings import Hooks

    outcomes: list[bool] = []
    agent: Agent

    def on_event(event: object) -> None:
        if getattr(event, "kind", None) == "turn_ended":  # inside the end's commit
            control = agent.turns.get("late")
            assert control is not None
            outcomes.append(control.cancel(CancelRequest(who="late")))

    agent = Agent(
        model=ScriptedModel([{"text": "done"}]),
        storage=Storage.local(tmp_path / "state"),
        hooks=Hooks(on_event=on_event),
    )
    async with agent:
        result = await agent.run("go", session="late")
        assert outcomes == [True] and result.status == "completed"
        kinds = [e.kind for e in await agent.session("late").events()]
        assert kinds.count("turn_ended") == 1 and "cancel_requested" not in kinds
        await agent.session("late").verify()
