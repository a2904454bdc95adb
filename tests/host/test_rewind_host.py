"""``POST /v1/sessions/{id}/rewind`` on a real host: the session's files come back, a
user's edit refuses it (409, naming the file) unless forced, the next message runs on the
new branch, and the rewind is undone."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from lodger.errors import HostConflictError

from ._support import running_host

pytestmark = pytest.mark.slow


def write(path: str, content: str) -> dict[str, object]:
    return {"calls": [{"name": "write_file", "args": {"path": path, "content": content}}]}


async def test_rewind_through_the_host(tmp_path: Path) -> None:
    turns = [
        [write("a.txt", "one\n"), {"text": "first"}],
        [write("a.txt", "two\n"), write("b.txt", "bee\n"), {"text": "second"}],
        [{"text": "third, on the branch"}],
    ]
    model = tmp_path / "turns.json"
    model.write_text(json.dumps({"turns": turns}))
    workspaces = tmp_path / "ws"
    async with (
        running_host(
            tmp_path / "state", models=(f"script:{model}",), workspaces=workspaces
        ) as host,
        host.client() as c,
    ):
        sid = await c.create_session(session_id="s1")
        for text in ("first", "second"):
            sent = await c.send(sid, text)
            assert (await c.wait_message(sid, sent["message"]["id"]))["status"] == "done"
        ws = workspaces / sid
        assert (ws / "a.txt").read_text() == "two\n" and (ws / "b.txt").exists()

        (ws / "a.txt").write_text("edited by hand\n")
        with pytest.raises(HostConflictError) as refused:
            await c.rewind(sid, turn=2)
        assert refused.value.code == "workspace_changed"
        assert "'a.txt'" in refused.value.message
        assert (ws / "a.txt").read_text() == "edited by hand\n"

        done = await c.rewind(sid, turn=2, force=True)
        assert (done["branch"], done["forced"], done["restored"], done["removed"]) == (
            "s1..r1",
            ["a.txt"],
            1,
            1,
        )
        assert (ws / "a.txt").read_text() == "one\n" and not (ws / "b.txt").exists()
        shown = await c.show(sid)
        assert shown["branch"] == "s1..r1" and shown["turns"] == 0
        facts = await c.events(done["branch"])
        assert [f.kind for f in facts] == ["session_started", "rewound"]
        assert facts[1].data["body"]["who"].startswith("token:")

        # the session's next message runs on its current branch
        sent = await c.send(sid, "third")
        assert (await c.wait_message(sid, sent["message"]["id"]))["status"] == "done"
        kinds = [f.kind for f in await c.events(done["branch"])]
        assert kinds[2] == "turn_started" and kinds[-1] == "turn_ended"

        undone = await c.rewind(sid, branch=sid)
        assert undone["branch"] == "s1..r2"
        assert (ws / "a.txt").read_text() == "edited by hand\n"
        assert (ws / "b.txt").read_text() == "bee\n"


async def test_events_and_stream_follow_the_current_branch(tmp_path: Path) -> None:
    """After a rewind the session's name reads and streams its newest branch, live
    facts included, not the first log."""
    turns = [[{"text": "first"}], [{"text": "second"}], [{"text": "on the branch"}]]
    model = tmp_path / "turns.json"
    model.write_text(json.dumps({"turns": turns}))
    async with (
        running_host(tmp_path / "state", models=(f"script:{model}",)) as host,
        host.client() as c,
    ):
        sid = await c.create_session(session_id="b1")
        for text in ("first", "second"):
            sent = await c.send(sid, text)
            assert (await c.wait_message(sid, sent["message"]["id"]))["status"] == "done"
        old = [f.data for f in await c.events(sid)]
        done = await c.rewind(sid, turn=2)
        branch = done["branch"]
        assert branch == "b1..r1"
        by_name = [f.data for f in await c.events(sid)]
        assert by_name == [f.data for f in await c.events(branch)]
        assert by_name != old and by_name[-1]["kind"] == "rewound"
        streamed = [f.data async for f in c.stream(sid, follow=False)]
        assert streamed == by_name

        live: list[dict[str, object]] = []

        async def follow() -> None:
            async for fact in c.stream(sid, after=len(by_name) - 1):
                live.append(fact.data)
                if fact.kind == "turn_ended":
                    return

        task = asyncio.create_task(follow())
        sent = await c.send(sid, "third")
        assert (await c.wait_message(sid, sent["message"]["id"]))["status"] == "done"
        await asyncio.wait_for(task, 30)
        assert [f["session_id"] for f in live] == [branch] * len(live)
        assert live[0]["kind"] == "turn_started" and live[0]["body"]["input"] == "third"
        assert live == [f.data for f in await c.events(sid)][len(by_name) :]
