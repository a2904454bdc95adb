"""Parked approvals over the distributed host: a real ``lodger worker --approval-park``
(real PostgreSQL, ``file://`` store, the host on loopback). The host lists the parked
question while no worker runs at all; ``POST .../approvals/CALL`` answers it and wakes
the session, a second answer is 409 ``already_answered``; a denial never runs the tool
and the model is shown the denial on its next step."""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import Callable
from pathlib import Path

import pytest

from lodger.client import StreamedFact
from lodger.errors import HostConflictError
from lodger.events import (
    EventDraft,
)
from lodger.runtime.sessions import Sessions
from lodger.storage import Storage
from lodger.testing.postgres import PostgresServer

from ._support import Setup
from .test_distributed import Host, _pending, _until, distributed_host, worker

pytestmark = pytest.mark.slow


@pytest.fixture
def setup(tmp_path: Path, postgres: PostgresServer) -> Setup:
    return Setup(f"file://{tmp_path / 'objects'}", postgres.new_database(), tmp_path)


DEPLOY = [{"calls": [{"name": "deploy", "args": {"target": "prod"}}]}, {"text": "over"}]


async def _until_dormant(host: Host, sid: str) -> None:
    """Until the worker has indexed the session ``waiting`` (and let it go dormant)."""
    async with asyncio.timeout(60):
        while (row := await host.plane.get_session(session_id=sid)) is None or (  # noqa: ASYNC110 - a worker writes it
            row.status != "waiting"
        ):
            await asyncio.sleep(0.05)


async def test_a_parked_approval_is_answered_over_the_host_and_wakes_the_session(
    setup: Setup,
) -> None:
    setup.script(DEPLOY)
    async with distributed_host(setup) as host, host.client() as a, host.client() as b:
        sid = await a.create_session(session_id="p1")
        sent = await a.send(sid, "ship it", key="1")
        with worker(setup, "--approval-park", approval_wait=0) as first:
            (pending,) = await _pending(a, sid)
            await _until_dormant(host, sid)
            os.kill(first.pid, signal.SIGKILL)
        # no worker runs: the host still lists the question, and answers it
        assert [p["call_id"] for p in await b.approvals()] == [pending["call_id"]]
        answered = await a.answer(sid, pending["call_id"], allow=False)
        assert answered["status"] == "deny"
        with pytest.raises(HostConflictError) as again:
            await b.answer(sid, pending["call_id"], allow=True)
        assert again.value.code == "already_answered"
        assert await a.approvals() == []
        (wake,) = await host.plane.pending_wakes(session_id=sid)  # the answer's wake
        assert wake.message is None
        seen: list[StreamedFact] = []
        with worker(setup, "--approval-park", approval_wait=0):
            await asyncio.wait_for(_until(a, sid, "turn_ended", seen), 60)
            done = await a.wait_message(sid, sent["message"]["id"], within=30)
            # the worker finishes the answer's wake after the turn (before it is killed)
            async with asyncio.timeout(30):
                while await host.plane.pending_wakes(session_id=sid):  # noqa: ASYNC110 - a worker's
                    await asyncio.sleep(0.05)
        assert done["status"] == "done"
        facts = await a.events(sid)
        decided = [f.data["body"]["decision"] for f in facts if f.kind == "permission_decided"]
        assert decided == ["park", "deny"]
        assert [f for f in facts if f.kind in ("tool_dispatched", "tool_responded")] == []
        rejected = [f.data["body"]["reason"] for f in facts if f.kind == "call_rejected"]
        assert rejected == ["denied"]
        # the model took one more step after the denial, with the denial in its context
        assert len([f for f in facts if f.kind == "step_started"]) == 2
        storage = Storage.from_url(setup.store)
        try:
            state = await Sessions(storage).state(sid)
        finally:
            await storage.close()
        results = [m for m in state.projector.project().messages if hasattr(m, "call_id")]
        assert [(m.call_id, m.is_error) for m in results] == [(pending["call_id"], True)]
        assert "denied" in results[0].content


async def _until_lease_lapses(host: Host, sid: str) -> None:
    """Until no worker holds the session's lease. A worker SIGKILLed just after it
    indexed the session ``waiting`` may still hold it (until its TTL) when it had not
    yet released it; the host refuses writes outside turns until then, as it should."""
    async with asyncio.timeout(60):
        lease = None
        while lease is None:
            lease = await host.plane.acquire_session(session_id=sid, holder="t", ttl_s=5)
            await asyncio.sleep(0 if lease else 0.1)
    await host.plane.release_session(lease=lease)


async def test_abandoning_a_parked_turn_withdraws_its_question(setup: Setup) -> None:
    setup.script(DEPLOY)
    async with distributed_host(setup) as host, host.client() as a:
        sid = await a.create_session(session_id="p2")
        await a.send(sid, "ship it", key="1")
        with worker(setup, "--approval-park", approval_wait=0) as first:
            (pending,) = await _pending(a, sid)
            await _until_dormant(host, sid)
            os.kill(first.pid, signal.SIGKILL)
        await _until_lease_lapses(host, sid)
        # a message a worker held back for the waiting turn (as it does when one comes)
        held = await host.plane.send(session_id=sid, message="next")
        assert held is not None
        await host.plane.hand_back_wake(wake_id=held, delay_s=3600, held=True)
        assert await a.abandon(sid, reason="not today")
        assert await a.approvals() == []  # nobody will ask for this answer any more
        (after,) = [w for w in await host.plane.pending_wakes(session_id=sid) if w.id == held]
        assert after.due_at <= await host.plane.now()  # the turn settled: it goes now
        with pytest.raises(HostConflictError) as late:
            await a.answer(sid, pending["call_id"], allow=True)
        assert late.value.code == "already_answered"
        facts = await a.events(sid)
        assert [f.data["body"]["status"] for f in facts if f.kind == "turn_ended"] == ["abandoned"]
        assert [f for f in facts if f.kind == "tool_dispatched"] == []


async def test_a_decision_over_the_host_releases_the_wakes_held_for_it(
    setup: Setup, stopped_after_t1: Callable[[str, str], list[EventDraft]]
) -> None:
    """A turn stopped after T1 of a call only an operator can settle: the message a
    worker held back for it is due the moment ``POST .../decide`` records the decision."""
    drafts = stopped_after_t1("charge", "/nowhere")
    storage = Storage.from_url(setup.store)
    try:
        async with await storage.log.open_writer("d1") as writer:
            await writer.append(drafts, expected_offset=0)
    finally:
        await storage.close()
    async with distributed_host(setup) as host, host.client() as a:
        held = await host.plane.send(session_id="d1", message="next")
        assert held is not None
        await host.plane.hand_back_wake(wake_id=held, delay_s=3600, held=True)
        await a.decide("d1", "c1", "not_applied")
        (after,) = await host.plane.pending_wakes(session_id="d1")
        assert after.id == held and after.due_at <= await host.plane.now()


async def test_cancel_of_a_dormant_parked_turn_ends_it_cancelled_once(setup: Setup) -> None:
    """No worker runs the parked turn: the host ends it cancelled under the session's
    lease and withdraws its question; asking again writes nothing."""
    setup.script(DEPLOY)
    async with distributed_host(setup) as host, host.client() as a:
        sid = await a.create_session(session_id="pc1")
        await a.send(sid, "ship it", key="1")
        with worker(setup, "--approval-park", approval_wait=0) as first:
            (pending,) = await _pending(a, sid)
            await _until_dormant(host, sid)
            os.kill(first.pid, signal.SIGKILL)
        before = len(await a.events(sid))
        done = await a.cancel(sid, reason="not today")
        assert (done["status"], done["turn_status"]) == ("cancelled", "cancelled")
        again = await a.cancel(sid)
        assert again["status"] == "not_running"
        facts = [f.data for f in await a.events(sid)]
        assert [f["kind"] for f in facts[before:]] == ["cancel_requested", "turn_ended"]
        assert facts[-1]["body"]["status"] == "cancelled"
        assert await a.approvals() == []  # the question is withdrawn
        with pytest.raises(HostConflictError):
            await a.answer(sid, pending["call_id"], allow=True)
