"""Steering, the queue, a mode switch and a cancel of a rewound session: its name leads
to the branch that runs, and each reaches the one registered control of that turn."""

from __future__ import annotations

import asyncio
from pathlib import Path

from lodger.events import CancelRequested, PermissionModeChanged, SteerReceived, TurnEnded
from lodger.providers.scripted import ScriptedModel
from lodger.runtime.builtin import workspace_tools
from lodger.runtime.sessions import Binding, Sessions
from lodger.storage import Storage
from lodger.tools import tool


async def test_a_rewound_sessions_name_reaches_the_turn_running_on_its_branch(
    tmp_path: Path,
) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "a.txt").write_text("one\n")
    sessions = Sessions(Storage.local(ws / ".lodger"))
    entered, release = asyncio.Event(), asyncio.Event()

    @tool
    async def hold() -> str:
        """Wait until the test lets go."""
        entered.set()
        await release.wait()
        return "released"

    def binding(*steps: dict[str, object]) -> Binding:
        script = ScriptedModel([*steps, {"text": "done"}])  # type: ignore[list-item]
        return Binding(model=script, tools=[*workspace_tools(), hold], workspace=ws)

    try:
        write = {"name": "write_file", "args": {"path": "a.txt", "content": "two\n"}}
        first = await sessions.run("go", binding=binding({"calls": [write]}), session="s")
        assert first.status == "completed"
        await sessions.rewind("s", turn=1)
        held = binding({"calls": [{"name": "hold", "args": {}}]})
        turn = asyncio.create_task(sessions.run("wait", binding=held, session="s"))
        await asyncio.wait_for(entered.wait(), 30)
        assert sessions.turns.get("s..r1") is not None  # registered under the branch
        assert sessions.turns.get("s") is None
        assert sessions.busy("s") and sessions.busy("s..r1")  # found by its name too
        steered = await sessions.steer("s", "look left", who="ana")
        assert steered.status == "steer"  # into the running turn, not queued
        switched = await sessions.set_permission_mode("s", "plan", who="ana")
        assert switched.status == "changed" and not switched.outside_run
        again = await sessions.set_permission_mode("s", "plan")
        assert again.status == "unchanged"
        queued = await sessions.enqueue("s", "later", who="ana")  # through the turn too
        assert [m.message_id for m in await sessions.queue("s")] == [queued.message_id]
        cancelled = await sessions.cancel("s", who="ana", reason="enough")
        assert cancelled.status == "cancelled", cancelled
        result = await turn
        assert result.status == "cancelled" and result.session_id == "s..r1"
        assert (await sessions.cancel("s")).status == "not_running"
        assert not sessions.busy("s")
        events = await sessions.storage.log.read_all("s..r1")
        turn_id = result.turn_id
        mine = [e.body for e in events if e.turn_id == turn_id]
        assert sum(isinstance(b, SteerReceived) for b in mine) == 1
        assert [b.mode for b in mine if isinstance(b, PermissionModeChanged)] == ["plan"]
        asked = [b for b in mine if isinstance(b, CancelRequested)]
        assert [(b.who, b.reason) for b in asked] == [("ana", "enough")]
        ended = [b.status for b in mine if isinstance(b, TurnEnded)]
        assert ended == ["cancelled"]  # one end: the cancel's
        # nothing of it landed on the branch the rewind left behind
        left = await sessions.storage.log.read_all("s")
        assert not any(isinstance(e.body, CancelRequested | SteerReceived) for e in left)
        # the steer no step carried was queued with the cancelled turn's end, after "later"
        assert [m.text for m in (await sessions.state("s")).queue] == ["later", "look left"]
    finally:
        release.set()
        await sessions.close()
