"""A cancel of a session whose turn is open but runs nowhere (its call parked for an
approval, the run ended interrupted) ends that turn ``cancelled`` through the session's
own writer, on a real SQLite log and on a ``file://`` object store: ``cancel_requested``
and ``turn_ended`` cancelled in one append, so no resume ever runs the parked call, the
log verifies; a second cancel writes nothing (``not_running``),
through the agent and through ``Sessions``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from lodger import Agent, tool
from lodger.engine.settings import Hooks
from lodger.events import CancelRequested, TurnEnded
from lodger.providers.base import ModelRequest, ModelResponse, ToolResultMessage
from lodger.providers.scripted import FunctionModel, tool_call
from lodger.runtime.sessions import Sessions
from lodger.storage import Storage

RAN: list[str] = []


@tool(approval=True)
def deploy(target: str) -> str:
    """Deploy to a target (needs approval)."""
    RAN.append(target)
    return f"deployed {target}"


async def _model(request: ModelRequest) -> ModelResponse:
    if any(isinstance(m, ToolResultMessage) for m in request.messages):
        return ModelResponse(text="done")
    return ModelResponse(calls=(tool_call("deploy", target="prod"),))


def _storage(tmp_path: Path, kind: str) -> Storage:
    if kind == "sqlite":
        return Storage.local(tmp_path / "state")
    return Storage.from_url(f"file://{tmp_path / 'objects'}")


def _agent(storage: Storage, answer: Any) -> Agent:
    async def approver(t: Any, arguments: dict[str, Any]) -> Any:
        return answer

    return Agent(
        model=FunctionModel(_model),
        tools=[deploy],
        storage=storage,
        hooks=Hooks(approver=approver),
    )


@pytest.mark.parametrize("kind", ["sqlite", "file"])
@pytest.mark.parametrize("door", ["agent", "sessions"])
async def test_cancel_ends_a_parked_turn_once(tmp_path: Path, kind: str, door: str) -> None:
    RAN.clear()
    async with _agent(_storage(tmp_path, kind), "park") as a:
        parked = await a.run("ship it", session="s1")
        assert parked.status == "waiting"
        before = len(await a.session("s1").events())
    if door == "agent":
        async with _agent(_storage(tmp_path, kind), "once") as a:
            done = await a.cancel("s1", who="alice", reason="changed my mind")
            again = await a.cancel("s1", who="alice")
    else:
        async with Sessions(_storage(tmp_path, kind)) as sessions:
            done = await sessions.cancel("s1", who="alice", reason="changed my mind")
            again = await sessions.cancel("s1", who="alice")
    assert (done.status, done.turn_status) == ("cancelled", "cancelled")
    assert done.turn_id == parked.turn_id
    assert again.status == "not_running"  # nothing more was written

    async with _agent(_storage(tmp_path, kind), "once") as a:
        log = await a.session("s1").events()
        await a.log.verify("s1")
        added = list(log)[before:]
        # the parked call was never dispatched (no T1): nothing of it needs deciding
        assert [e.kind for e in added] == ["cancel_requested", "turn_ended"]
        asked, ended = (e.body for e in added)
        assert isinstance(asked, CancelRequested) and asked.who == "alice"
        assert isinstance(ended, TurnEnded) and ended.status == "cancelled"
        assert ended.reason == "changed my mind"
        assert {e.turn_id for e in added} == {parked.turn_id}
        # nothing is left to resume: the parked call never runs, now or later
        assert (await a.recovery_plan("s1")).calls == ()  # no open turn: nothing to resume
        nxt = await a.run("something else", session="s1")
        assert nxt.status == "completed"
    assert RAN == ["prod"]  # only the new turn's call (allowed) ran; the parked one never


async def test_a_session_with_no_open_turn_or_no_log_writes_nothing(tmp_path: Path) -> None:
    storage = _storage(tmp_path, "sqlite")
    async with _agent(storage, "once") as a:
        assert (await a.run("go", session="s1")).status == "completed"
        count = len(await a.session("s1").events())
        assert (await a.cancel("s1")).status == "not_running"
        assert len(await a.session("s1").events()) == count
        assert (await a.cancel("nobody")).status == "unknown_session"
