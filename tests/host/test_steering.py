"""Steering and the follow-up queue over the real host (uvicorn in-process, real SQLite).

A turn is held inside the ``gate`` tool until the test creates its file, so every
steer and queued message below arrives while a call runs; the test waits for facts in
the log (bounded), never for time to pass.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from lodger.client import HostClient
from lodger.context import project_messages
from lodger.errors import LodgerError
from lodger.events import (
    Event,
    MessageQueued,
    QueueChanged,
    SteerDelivered,
    SteerReceived,
    StepStarted,
    TurnEnded,
    TurnStarted,
)
from lodger.providers.base import UserMessage
from lodger.storage import Storage

from ._support import Host, running_host, write_script

STEPS = [{"calls": [{"name": "gate", "args": {"name": "g"}}]}, {"text": "done"}]


async def _log(host: Host, session_id: str) -> list[Event]:
    storage = Storage.local(host.state)
    try:
        return await storage.log.read(session_id)
    finally:
        await storage.close()


async def _until(host: Host, session_id: str, done: Any, within: float = 30.0) -> list[Event]:
    """The session's log once ``done(events)`` holds (polled, bounded)."""
    async with asyncio.timeout(within):
        while True:
            events = await _log(host, session_id)
            if done(events):
                return events
            await asyncio.sleep(0.05)


def _inputs(events: list[Event]) -> list[str]:
    return [e.body.input for e in events if isinstance(e.body, TurnStarted)]


def _ended(events: list[Event]) -> list[TurnEnded]:
    return [e.body for e in events if isinstance(e.body, TurnEnded)]


async def _gate_running(gates: Path) -> None:
    async with asyncio.timeout(30):
        while not (gates / "g.starts").exists():  # noqa: ASYNC110 - the host's tool makes it
            await asyncio.sleep(0.02)


async def _start(client: HostClient, gates: Path) -> str:
    sid = await client.create_session()
    await client.send(sid, "go")
    await _gate_running(gates)
    return sid


async def test_a_steer_sent_while_a_tool_runs_is_delivered_with_its_step(
    tmp_path: Path, gates: Path
) -> None:
    model = write_script(tmp_path / "script.json", STEPS)
    async with (
        running_host(tmp_path / "state", models=(model,)) as host,
        host.client() as client,
    ):
        sid = await _start(client, gates)
        steered = await client.steer(sid, "look in src/ first")
        assert steered["status"] == "steer"
        (gates / "g").touch()
        events = await _until(host, sid, lambda ev: len(_ended(ev)) == 1)
        queue = await client.queue(sid)
    received = [e for e in events if isinstance(e.body, SteerReceived)]
    assert [e.body.text for e in received] == ["look in src/ first"]
    assert received[0].body.who is not None and received[0].body.who.startswith("token:")
    delivered = [e for e in events if isinstance(e.body, SteerDelivered)]
    assert len(delivered) == 1 and delivered[0].body.step == 1
    assert delivered[0].body.steer_ids == (steered["steer_id"],)
    step1 = next(e for e in events if isinstance(e.body, StepStarted) and e.body.index == 1)
    assert delivered[0].offset == step1.offset + 1  # before step 1's request was built
    # the model's context (a pure function of the log) has it after the tool's result
    messages = project_messages(events).messages
    users = [(m.text, m.source) for m in messages if isinstance(m, UserMessage)]
    assert users == [("go", "input"), ("look in src/ first", "steer")]
    assert _ended(events)[0].status == "completed"
    assert queue["messages"] == []


async def test_a_steer_to_an_idle_session_is_its_next_turn(tmp_path: Path, gates: Path) -> None:
    (gates / "g").touch()
    model = write_script(tmp_path / "script.json", STEPS)
    async with (
        running_host(tmp_path / "state", models=(model,)) as host,
        host.client() as client,
    ):
        sid = await client.create_session()
        message = await client.send(sid, "first")
        await client.wait_message(sid, message["message"]["id"])
        steered = await client.steer(sid, "and now this")
        assert steered["status"] == "queued"
        events = await _until(host, sid, lambda ev: len(_ended(ev)) == 2)
    assert _inputs(events) == ["first", "and now this"]
    delivered = [e.body for e in events if isinstance(e.body, QueueChanged)]
    assert [(c.message_id, c.action) for c in delivered] == [(steered["steer_id"], "delivered")]


async def test_each_policy_under_two_senders(tmp_path: Path, gates: Path) -> None:
    model = write_script(tmp_path / "script.json", STEPS)
    async with running_host(tmp_path / "state", models=(model,)) as host, host.client() as ana:
        sid = await _start(ana, gates)
        bo = host.client(await ana.make_token(label="bo"))
        async with bo:
            later = await ana.follow_up(sid, "later")
            with pytest.raises(LodgerError) as refused:
                await bo.follow_up(sid, "refused", policy="reject")
            assert refused.value.code == "session_busy"
            now = await bo.follow_up(sid, "now", policy="interrupt")
            listed = await ana.queue(sid)
            assert listed["busy"] is True
            assert [m["text"] for m in listed["messages"]] == ["now", "later"]
            assert listed["messages"][0]["who"] != listed["messages"][1]["who"]
            (gates / "g").touch()  # the call in flight settles; then the turn stops
            events = await _until(host, sid, lambda ev: len(_ended(ev)) == 3)
            assert (await bo.queue(sid))["messages"] == []
    assert _inputs(events) == ["go", "now", "later"]
    first = _ended(events)[0]
    assert first.status == "cancelled"
    assert first.reason == f"interrupted for queued message {now['message_id']}"
    assert [e.status for e in _ended(events)[1:]] == ["completed", "completed"]
    assert (gates / "g.starts").read_text().count("start") == 3  # once a turn, never again
    queued = [e.body for e in events if isinstance(e.body, MessageQueued)]
    assert [q.message_id for q in queued] == [later["message_id"], now["message_id"]]
    assert "refused" not in {q.text for q in queued}


async def test_rollback_and_queue_edits_over_http(tmp_path: Path, gates: Path) -> None:
    model = write_script(tmp_path / "script.json", STEPS)
    async with (
        running_host(tmp_path / "state", models=(model,)) as host,
        host.client() as client,
    ):
        sid = await _start(client, gates)
        a = await client.follow_up(sid, "a")
        b = await client.follow_up(sid, "b")
        c = await client.follow_up(sid, "c")
        edited = await client.change_queued(sid, b["message_id"], text="B", position=0)
        assert [m["text"] for m in edited["messages"]] == ["B", "a", "c"]
        left = await client.retract_queued(sid, a["message_id"])
        assert [m["text"] for m in left["messages"]] == ["B", "c"]
        with pytest.raises(LodgerError) as gone:
            await client.retract_queued(sid, a["message_id"])
        assert gone.value.code == "not_queued"
        with pytest.raises(LodgerError) as bad:
            await client.follow_up(sid, "x", policy="sometimes")
        assert bad.value.code == "invalid_request"
        back = await client.follow_up(sid, "instead", policy="rollback")
        (gates / "g").touch()
        events = await _until(host, sid, lambda ev: len(_ended(ev)) == 4)
    assert _inputs(events) == ["go", "instead", "B", "c"]
    first = _ended(events)[0]
    assert first.status == "abandoned"
    assert first.reason == f"rolled back for queued message {back['message_id']}"
    changes = [
        (q.message_id, q.action) for q in (e.body for e in events) if isinstance(q, QueueChanged)
    ]
    assert (b["message_id"], "edit") in changes and (b["message_id"], "move") in changes
    assert (a["message_id"], "retract") in changes
    assert (c["message_id"], "delivered") in changes
