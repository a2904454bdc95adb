"""Approvals in the control plane (schema version 3), on SQLite and PostgreSQL: one
answer wins, a deadline expires an unanswered question, the question of a worker that
lost the session's lease is answered by nobody, and a worker-side waiter gets the
answer (or a denial at its deadline)."""

from __future__ import annotations

import asyncio

from lodger.runtime.approvals import ControlApprovals
from lodger.storage.control._sql import SqlControlPlane


async def _ask(plane: SqlControlPlane, call: str = "c1", wait_s: float = 60.0) -> None:
    await _hold(plane)
    await plane.ask_approval(
        session_id="s1", call_id=call, tool="deploy", summary='{"target": "prod"}',
        holder="worker-a", wait_s=wait_s,
    )  # fmt: skip


async def _hold(plane: SqlControlPlane, holder: str = "worker-a", ttl_s: float = 60) -> None:
    """``holder`` takes the session's lease (a worker asks while it runs the session)."""
    if await plane.acquire_session(session_id="s1", holder=holder, ttl_s=ttl_s) is None:
        return  # held already (by this holder, in these tests)


async def test_concurrent_answers_one_wins(plane: SqlControlPlane) -> None:
    await _ask(plane)
    (pending,) = await plane.list_approvals()
    assert (pending.call_id, pending.tool, pending.status, pending.asked_by) == (
        "c1", "deploy", "pending", "worker-a",
    )  # fmt: skip
    answers = await asyncio.gather(
        *(
            plane.answer_approval(session_id="s1", call_id="c1", allow=i % 2 == 0, by=f"c{i}")
            for i in range(6)
        )
    )
    winners = [(row, won) for row, won in answers if won]
    assert len(winners) == 1
    row, _ = winners[0]
    assert row is not None
    final = await plane.poll_approval(session_id="s1", call_id="c1")
    assert final is not None
    assert (final.status, final.answered_by) == (row.status, row.answered_by)
    assert await plane.list_approvals() == []
    assert [a.call_id for a in await plane.list_approvals(status=row.status)] == ["c1"]
    # every loser saw the winner's decision
    assert all(r is not None and r.status == row.status for r, _ in answers)


async def test_unknown_call(plane: SqlControlPlane) -> None:
    assert await plane.answer_approval(session_id="s1", call_id="nope", allow=True, by="x") == (
        None,
        False,
    )
    assert await plane.poll_approval(session_id="s1", call_id="nope") is None


async def test_deadline_expires_and_refuses_a_late_answer(plane: SqlControlPlane) -> None:
    await _ask(plane, wait_s=0.2)
    await asyncio.sleep(0.4)
    assert await plane.list_approvals() == []  # nobody waits for it any more
    late, won = await plane.answer_approval(session_id="s1", call_id="c1", allow=True, by="x")
    assert not won and late is not None
    polled = await plane.poll_approval(session_id="s1", call_id="c1")
    assert polled is not None and polled.status == "expired"
    # asked again (a resume): pending afresh, and answerable
    await _ask(plane)
    row, won = await plane.answer_approval(session_id="s1", call_id="c1", allow=True, by="y")
    assert won and row is not None and row.status == "allow"


async def test_a_dead_workers_question_is_answered_by_nobody(plane: SqlControlPlane) -> None:
    lease = await plane.acquire_session(session_id="s1", holder="worker-a", ttl_s=0.3)
    assert lease is not None
    await plane.ask_approval(
        session_id="s1", call_id="c1", tool="deploy", summary="{}", holder="worker-a", wait_s=60
    )
    assert [a.call_id for a in await plane.list_approvals()] == ["c1"]
    await asyncio.sleep(0.5)  # worker-a stopped renewing (SIGKILL): its lease expires
    assert await plane.list_approvals() == []
    row, won = await plane.answer_approval(session_id="s1", call_id="c1", allow=True, by="op")
    assert not won and row is not None and row.status == "expired"
    # another worker takes the session and asks about the call: pending again, answerable
    assert await plane.acquire_session(session_id="s1", holder="worker-b", ttl_s=60)
    await plane.ask_approval(
        session_id="s1", call_id="c1", tool="deploy", summary="{}", holder="worker-b", wait_s=60
    )
    (pending,) = await plane.list_approvals()
    assert (pending.status, pending.asked_by) == ("pending", "worker-b")
    row, won = await plane.answer_approval(session_id="s1", call_id="c1", allow=False, by="op")
    assert won and row is not None and (row.status, row.answered_by) == ("deny", "op")


async def test_the_worker_waits_for_an_answer(plane: SqlControlPlane) -> None:
    await _hold(plane)
    approvals = ControlApprovals(plane, holder="worker-a", wait_s=30, poll_s=0.02)
    waiting = asyncio.create_task(approvals.wait("s1", "c1", tool="deploy", summary="{}"))
    while not await plane.list_approvals():
        assert not waiting.done()
        await asyncio.sleep(0.02)
    assert not waiting.done()
    await plane.answer_approval(session_id="s1", call_id="c1", allow=True, by="op")
    assert await asyncio.wait_for(waiting, 10) is True


async def test_the_worker_is_denied_at_its_deadline(plane: SqlControlPlane) -> None:
    approvals = ControlApprovals(plane, holder="worker-a", wait_s=0.3, poll_s=0.02)
    assert await asyncio.wait_for(approvals.wait("s1", "c9", tool="t", summary=""), 10) is False
    polled = await plane.poll_approval(session_id="s1", call_id="c9")
    assert polled is not None and polled.status == "expired"
