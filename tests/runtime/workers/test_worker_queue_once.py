"""A follow-up a worker committed to the log but did not forget in the control plane
(it died between the two) is committed once: the next worker that takes it finds its id
in the log and only forgets it. Real SQLite log and control plane."""

from __future__ import annotations

from pathlib import Path

from lodger import Agent, ScriptedModel
from lodger.events import MessageQueued
from lodger.runtime._followups import session_fact
from lodger.runtime._worker_queue import take_into_log
from lodger.runtime.sessions import Sessions
from lodger.storage import Storage
from lodger.storage.control import SqliteControlPlane


async def test_a_message_committed_before_a_crash_is_committed_once(tmp_path: Path) -> None:
    plane = SqliteControlPlane(tmp_path / "control.sqlite3")
    await plane.start()
    try:
        async with Agent(
            model=ScriptedModel([{"text": "hi"}]), storage=Storage.local(tmp_path / "state")
        ) as agent:
            assert (await agent.run("go", session="s1")).status == "completed"
        async with Sessions(Storage.local(tmp_path / "state")) as sessions:
            await plane.add_queued(
                session_id="s1", message_id="m1", text="next", policy="enqueue", who="t"
            )
            taken = await plane.take_queued(session_id="s1", holder="w1")
            assert taken is not None and taken.taken_by == "w1"
            # worker w1 commits it, then dies before done_queued
            await session_fact(
                sessions,
                "s1",
                MessageQueued(message_id="m1", text="next", policy="enqueue", who="t"),
            )
            assert await take_into_log(plane, sessions, "s1", "w2") is True
            assert [m.message_id for m in await sessions.queue("s1")] == ["m1"]  # once
            assert await plane.list_queued(session_id="s1") == []
            assert await take_into_log(plane, sessions, "s1", "w2") is False  # nothing left
            events = list((await sessions.state("s1")).events)
            assert sum(e.kind == "message_queued" for e in events) == 1
    finally:
        await plane.close()
