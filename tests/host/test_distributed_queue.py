"""The follow-up queue of sessions that run on workers, over real parts: a real
PostgreSQL control plane (``session_queue``), a ``file://`` object store, a real
``lodger worker`` subprocess and the host on loopback. Messages queued while a worker
runs the turn are listed, edited, moved and retracted in the control plane, then run in
that order once the turn settles; ``reject`` is refused while the session has work;
``interrupt`` stops the running turn and runs next, whether queued or sent as a message;
a queued message wakes a dormant session."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from lodger.client import HostClient
from lodger.errors import HostConflictError

from ._support import Setup
from .test_distributed import distributed_host, setup, worker

__all__ = ["setup"]  # the fixture, imported for pytest

pytestmark = pytest.mark.slow

GATED = [{"calls": [{"name": "gate", "args": {"name": "g"}}]}, {"text": "done"}]


async def _facts(client: HostClient, sid: str, kind: str, count: int) -> list[dict[str, Any]]:
    """The session's facts once ``count`` of ``kind`` are in (polled, bounded)."""
    async with asyncio.timeout(60):
        while True:
            facts = [f.data for f in await client.events(sid)]
            if sum(f["kind"] == kind for f in facts) >= count:
                return facts
            await asyncio.sleep(0.05)


async def _gate_started(gates: Path) -> None:
    async with asyncio.timeout(60):
        while not (gates / "g.starts").exists():  # noqa: ASYNC110 - the worker's tool
            await asyncio.sleep(0.02)


async def _stop_delivered(plane: Any, sid: str) -> None:
    """The worker took the stop a message with policy interrupt asked for."""
    async with asyncio.timeout(60):
        while True:
            async with plane._tx() as tx:  # no reading door for settled requests: SQL
                rows = await tx.rows(
                    "SELECT status FROM session_cancels WHERE session_id = %s "
                    "AND policy = 'interrupt'",
                    (sid,),
                )
            if rows and rows[0][0] == "stopped":
                return
            await asyncio.sleep(0.05)


def _turns(facts: list[dict[str, Any]]) -> list[tuple[str, str]]:
    inputs = [f["body"]["input"] for f in facts if f["kind"] == "turn_started"]
    ends = [f["body"]["status"] for f in facts if f["kind"] == "turn_ended"]
    return list(zip(inputs, ends, strict=False))


async def test_queue_while_a_worker_runs_then_in_order_and_a_dormant_wake(
    setup: Setup, gates: Path
) -> None:
    setup.script(GATED)
    async with distributed_host(setup) as host, host.client() as client:
        sid = await client.create_session(session_id="q1")
        await client.send(sid, "go", key="1")
        with worker(setup):
            await _gate_started(gates)
            a, b, c = [await client.follow_up(sid, t) for t in ("a", "b", "c")]
            assert (a["offset"], a["policy"]) == (None, "enqueue")
            assert a["who"].startswith("token:")
            with pytest.raises(HostConflictError) as refused:
                await client.follow_up(sid, "not now", policy="reject")
            assert refused.value.code == "session_busy"
            await client.change_queued(sid, a["message_id"], text="a2")
            await client.change_queued(sid, c["message_id"], position=0)
            left = await client.retract_queued(sid, b["message_id"])
            assert [m["text"] for m in left["messages"]] == ["c", "a2"]
            assert left["busy"] is True
            # nothing of it is in the log yet: the control plane holds it
            assert not any(f.kind == "message_queued" for f in await client.events(sid))
            (gates / "g").touch()
            facts = await _facts(client, sid, "turn_ended", 3)
            assert _turns(facts) == [("go", "completed"), ("c", "completed"), ("a2", "completed")]
            queued = [f["body"] for f in facts if f["kind"] == "message_queued"]
            assert [(q["message_id"], q["text"]) for q in queued] == [
                (c["message_id"], "c"),
                (a["message_id"], "a2"),
            ]
            assert all(q["who"].startswith("token:") for q in queued)
            assert await host.plane.list_queued(session_id=sid) == []
            assert (await client.queue(sid))["messages"] == []

            # the worker has let the session go: a queued message wakes it
            async with asyncio.timeout(60):
                while (await client.show(sid))["running"]:  # noqa: ASYNC110
                    await asyncio.sleep(0.05)
            await client.follow_up(sid, "later")
            facts = await _facts(client, sid, "turn_ended", 4)
        assert [t for t, _ in _turns(facts)] == ["go", "c", "a2", "later"]
        assert sum(f["kind"] == "turn_started" for f in facts) == 4  # each ran once


async def test_interrupt_queued_or_sent_stops_the_worker_turn_and_runs_next(
    setup: Setup, gates: Path
) -> None:
    setup.script(GATED)
    async with distributed_host(setup) as host, host.client() as client:
        sid = await client.create_session(session_id="q2")
        await client.send(sid, "go", key="1")
        with worker(setup):
            await _gate_started(gates)
            await client.follow_up(sid, "waiting")  # enqueue: after the urgent one
            urgent = await client.follow_up(sid, "stop and do this", policy="interrupt")
            listed = (await client.queue(sid))["messages"]
            assert listed[0]["text"] == "stop and do this"
            # the worker takes it into the running turn at once (and asks it to stop)
            async with asyncio.timeout(60):
                while not any(  # noqa: ASYNC110 - the worker commits it
                    f.kind == "message_queued"
                    and f.data["body"]["message_id"] == urgent["message_id"]
                    for f in await client.events(sid)
                ):
                    await asyncio.sleep(0.05)
            (gates / "g").touch()  # the call settles; the turn stops at the step boundary
            facts = await _facts(client, sid, "turn_ended", 3)
            assert _turns(facts) == [
                ("go", "cancelled"),
                ("stop and do this", "completed"),
                ("waiting", "completed"),
            ]

            # a message sent with policy interrupt: an urgent wake, ahead of an older one
            (gates / "g").unlink()
            (gates / "g.starts").unlink()
            async with asyncio.timeout(60):
                while (await client.show(sid))["running"]:  # noqa: ASYNC110
                    await asyncio.sleep(0.05)
            await client.send(sid, "second go", key="2")
            await _gate_started(gates)
            await client.send(sid, "after it", key="3")
            sent = await client.send(sid, "urgent message", key="4", policy="interrupt")
            again = await client.send(sid, "urgent message", key="4", policy="interrupt")
            assert again["created"] is False
            with pytest.raises(HostConflictError):
                await client.send(sid, "x", key="5", policy="reject")
            await _stop_delivered(host.plane, sid)
            (gates / "g").touch()
            facts = await _facts(client, sid, "turn_ended", 6)
            done = await client.wait_message(sid, sent["message"]["id"])
            assert done["status"] == "done"
        assert _turns(facts)[3:] == [
            ("second go", "cancelled"),
            ("urgent message", "completed"),
            ("after it", "completed"),
        ]


async def test_a_mode_switch_reaches_the_turn_a_worker_runs(setup: Setup, gates: Path) -> None:
    """Through the control plane (``session_modes``): the worker commits it through the
    running turn; the same mode again writes nothing; a dormant session's switch is
    committed by the host."""
    setup.script(GATED)
    async with distributed_host(setup) as host, host.client() as client:
        sid = await client.create_session(session_id="m1")
        await client.send(sid, "go", key="1")
        with worker(setup):
            await _gate_started(gates)
            switched = await client.set_permission_mode(sid, "plan")
            assert (switched["status"], switched["mode"]) == ("changed", "plan")
            same = await client.set_permission_mode(sid, "plan")
            assert same["status"] == "unchanged"
            (gates / "g").touch()
            facts = await _facts(client, sid, "turn_ended", 1)
            changed = [f for f in facts if f["kind"] == "permission_mode_changed"]
            assert [c["body"]["mode"] for c in changed] == ["plan"]
            (started,) = [f for f in facts if f["kind"] == "turn_started"]
            assert changed[0]["turn_id"] == started["turn_id"]  # inside the running turn
            assert changed[0]["body"]["who"].startswith("token:")
            async with asyncio.timeout(60):
                while (await client.show(sid))["running"]:  # noqa: ASYNC110
                    await asyncio.sleep(0.05)
            back = await client.set_permission_mode(sid, "ask")
            assert (back["status"], back["previous"]) == ("changed", "plan")
        facts = [f.data for f in await client.events(sid)]
        assert [f["body"]["mode"] for f in facts if f["kind"] == "permission_mode_changed"] == [
            "plan",
            "ask",
        ]
        assert facts[-1]["kind"] == "permission_mode_changed"  # outside any turn


async def test_rewind_of_a_worker_run_session_and_the_next_wake_works_there(
    setup: Setup,
) -> None:
    """A worker-run session's workspace is its snapshots: the host rewinds it (no local
    directory), the next worker wakes it in the rewound files, and the name's events
    read the new branch; undo brings the later files back."""
    write = {"name": "write_file", "args": {"path": "a.txt", "content": "one\n"}}
    setup.script([{"calls": [write]}, {"text": "first"}])
    async with distributed_host(setup) as host, host.client() as c:
        sid = await c.create_session(session_id="r1")
        with worker(setup):
            sent = await c.send(sid, "first", key="1")
            assert (await c.wait_message(sid, sent["message"]["id"], within=60))["status"] == "done"
            second = {"name": "write_file", "args": {"path": "b.txt", "content": "bee\n"}}
            setup.script([{"calls": [second]}, {"text": "second"}])
            sent = await c.send(sid, "second", key="2")
            assert (await c.wait_message(sid, sent["message"]["id"], within=60))["status"] == "done"
            async with asyncio.timeout(60):
                while (await c.show(sid))["running"]:  # noqa: ASYNC110
                    await asyncio.sleep(0.05)
            done = await c.rewind(sid, turn=2)
            assert done["branch"] == "r1..r1" and done["removed"] == 1
            events = [f.data for f in await c.events(sid)]
            assert events == [f.data for f in await c.events("r1..r1")]
            read = {"name": "read_file", "args": {"path": "b.txt"}}
            setup.script([{"calls": [read]}, {"text": "looked"}])
            sent = await c.send(sid, "is b there?", key="3")
            assert (await c.wait_message(sid, sent["message"]["id"], within=60))["status"] == "done"
            facts = [f.data for f in await c.events(sid)]
            (looked,) = [f["body"] for f in facts[len(events) :] if f["kind"] == "tool_responded"]
            assert looked["status"] == "error" or "bee" not in str(looked["content"]), looked
            async with asyncio.timeout(60):
                while (await c.show(sid))["running"]:  # noqa: ASYNC110
                    await asyncio.sleep(0.05)
            undone = await c.rewind(sid, branch=sid)  # back to the branch left behind
            assert undone["restored"] >= 1
            read_a = {"name": "read_file", "args": {"path": "b.txt"}}
            setup.script([{"calls": [read_a]}, {"text": "back"}])
            sent = await c.send(sid, "and now?", key="4")
            assert (await c.wait_message(sid, sent["message"]["id"], within=60))["status"] == "done"
        facts = [f.data for f in await c.events(sid)]
        last = [f["body"] for f in facts if f["kind"] == "tool_responded"][-1]
        assert "bee" in str(last["content"]), last
