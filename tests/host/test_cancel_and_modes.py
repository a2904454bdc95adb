"""Cancel and permission modes over the host: a real host on loopback, a real bubblewrap
command in the session's workspace, the token named as who asked."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from lodger.errors import SessionNotFoundError, UsageError
from lodger.storage.control.host_index import hash_token, token_id

from ._support import running_host, write_script

SLOW = "touch started; sleep 30; touch after"


async def _appears(path: Path) -> None:
    async with asyncio.timeout(30):
        while not await asyncio.to_thread(path.exists):  # noqa: ASYNC110 - bwrap makes it
            await asyncio.sleep(0.02)


async def test_cancel_over_the_host_settles_the_sandboxed_command(tmp_path: Path) -> None:
    script = [{"calls": [{"name": "shell", "args": {"command": SLOW}}]}, {"text": "never"}]
    model = write_script(tmp_path / "s.json", script)
    workspaces = tmp_path / "ws"
    async with (
        running_host(tmp_path / "state", models=(model,), workspaces=workspaces) as host,
        host.client() as admin,
    ):
        sid = await admin.create_session(session_id="h1")
        idle = await admin.cancel(sid)  # nothing runs yet: nothing is written
        assert idle["status"] == "not_running"
        sent = await admin.send(sid, "go", key="k1")
        await _appears(workspaces / sid / "started")
        first, second = await asyncio.gather(
            admin.cancel(sid, reason="stop now"), admin.cancel(sid, reason="again")
        )
        # one of them cancelled the turn; the other came while it settled, or after
        statuses = [first["status"], second["status"]]
        statuses.remove("cancelled")
        assert statuses[0] in ("already_cancelling", "not_running"), statuses
        done = await admin.wait_message(sid, sent["message"]["id"])
        assert done["result"]["status"] == "cancelled"
        facts = await admin.events(sid)
        kinds = [f.kind for f in facts]
        # a turn with a workspace ends with its snapshot, committed with the cancel
        assert kinds[-4:] == ["cancel_requested", "workspace_snapshot", "run_ended", "turn_ended"]
        assert kinds.count("cancel_requested") == 1  # whatever the second one said
        asked = facts[-4].data["body"]
        public = token_id(hash_token(host.token))
        # the two requests race over HTTP: the fact is the one that was answered cancelled
        won = "stop now" if first["status"] == "cancelled" else "again"
        assert asked["who"] == f"token:{public}" and asked["reason"] == won
        responded = [f.data["body"] for f in facts if f.kind == "tool_responded"]
        assert [r["status"] for r in responded] == ["cancelled"]
        assert not (workspaces / sid / "after").exists()
        assert (await admin.cancel(sid))["status"] == "not_running"
        assert len(await admin.events(sid)) == len(facts)  # nothing written twice


async def test_mode_over_the_host(tmp_path: Path) -> None:
    script = [
        {"calls": [{"name": "write_file", "args": {"path": "x.txt", "content": "hi"}}]},
        {"text": "done"},
    ]
    model = write_script(tmp_path / "s.json", script)
    workspaces = tmp_path / "ws"
    async with (
        running_host(tmp_path / "state", models=(model,), workspaces=workspaces) as host,
        host.client() as admin,
    ):
        sid = await admin.create_session(session_id="m1")
        with pytest.raises(SessionNotFoundError):  # no turn yet: no log to switch
            await admin.set_permission_mode(sid, "plan")
        sent = await admin.send(sid, "first", key="k1")
        await admin.wait_message(sid, sent["message"]["id"])
        assert (workspaces / sid / "x.txt").read_text() == "hi"
        (workspaces / sid / "x.txt").unlink()
        head = len(await admin.events(sid)) - 1

        async def streamed() -> str:
            async for fact in admin.stream(sid, after=head):
                return fact.kind
            raise AssertionError("the stream ended")

        live = asyncio.create_task(streamed())  # open before the switch: it arrives live
        switched = await admin.set_permission_mode(sid, "plan")
        assert await asyncio.wait_for(live, 30) == "permission_mode_changed"
        assert (switched["status"], switched["previous"]) == ("changed", None)
        assert (await admin.set_permission_mode(sid, "plan"))["status"] == "unchanged"
        shown = await admin.show(sid)
        assert shown["permission_mode"] == "plan"
        sent = await admin.send(sid, "second", key="k2")
        await admin.wait_message(sid, sent["message"]["id"])
        assert not (workspaces / sid / "x.txt").exists()  # plan mode refused the edit
        facts = await admin.events(sid)
        changed = [f for f in facts if f.kind == "permission_mode_changed"]
        assert len(changed) == 1 and changed[0].data["body"]["mode"] == "plan"
        rejected = [f.data["body"] for f in facts if f.kind == "call_rejected"]
        assert len(rejected) == 1 and "plan mode" in rejected[0]["message"]
        with pytest.raises(UsageError):  # refused by the body's schema (422)
            await admin.set_permission_mode(sid, "yolo")
