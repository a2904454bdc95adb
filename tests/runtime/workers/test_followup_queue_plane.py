"""The control plane's follow-up queue (``session_queue``, schema version 11) on SQLite
and PostgreSQL: order and policies as the log's queue has them, edits, moves and
retracts with their author, a worker taking messages, wakes for a dormant session, and
urgent wakes claimed before a session's older ones."""

from __future__ import annotations

import asyncio

from lodger.storage.control._sql import SqlControlPlane


async def _texts(plane: SqlControlPlane, sid: str) -> list[str]:
    return [r.text for r in await plane.list_queued(session_id=sid)]


async def test_order_changes_and_authors(plane: SqlControlPlane) -> None:
    lease = await plane.acquire_session(session_id="s1", holder="w1", ttl_s=60)
    assert lease is not None
    for i, (text, policy) in enumerate(
        [("a", "enqueue"), ("b", "enqueue"), ("urgent1", "interrupt"), ("urgent2", "rollback")]
    ):
        row, held = await plane.add_queued(
            session_id="s1", message_id=f"m{i}", text=text, policy=policy, who="token:x"
        )
        assert held and row is not None and row.who == "token:x"
    # urgent ones ahead of the waiting ones, in their own order (as the log's queue folds)
    assert await _texts(plane, "s1") == ["urgent1", "urgent2", "a", "b"]
    assert await plane.pending_wakes(session_id="s1") == []  # held: the worker takes them

    moved = await plane.change_queued(
        session_id="s1", message_id="m1", action="move", position=0, who="token:y"
    )
    assert moved is not None and [r.text for r in moved] == ["b", "urgent1", "urgent2", "a"]
    assert [r.position for r in moved] == [0, 1, 2, 3]
    edited = await plane.change_queued(
        session_id="s1", message_id="m0", action="edit", text="a2", who="token:z"
    )
    assert edited is not None
    (a2,) = [r for r in edited if r.message_id == "m0"]
    assert (a2.text, a2.who, a2.changed_by) == ("a2", "token:x", "token:z")
    left = await plane.change_queued(session_id="s1", message_id="m2", action="retract", who="t")
    assert left is not None and [r.text for r in left] == ["b", "urgent2", "a2"]
    # a message gone (or unknown) changes nothing
    assert (
        await plane.change_queued(session_id="s1", message_id="m2", action="retract", who="t")
        is None
    )
    assert (
        await plane.change_queued(
            session_id="s1", message_id="zz", action="edit", text="x", who="t"
        )
        is None
    )

    # urgent_only takes nothing while an enqueue message is first
    assert await plane.take_queued(session_id="s1", holder="w1", urgent_only=True) is None
    taken = await plane.take_queued(session_id="s1", holder="w1")
    assert taken is not None and (taken.text, taken.taken_by) == ("b", "w1")
    # a taken message is being committed: it can no longer be changed
    assert (
        await plane.change_queued(
            session_id="s1", message_id="m1", action="edit", text="x", who="t"
        )
        is None
    )
    await plane.done_queued(session_id="s1", message_id="m1")
    assert await _texts(plane, "s1") == ["urgent2", "a2"]
    assert [r.position for r in await plane.list_queued(session_id="s1")] == [0, 1]
    urgent = await plane.take_queued(session_id="s1", holder="w1", urgent_only=True)
    assert urgent is not None and urgent.policy == "rollback"
    assert await plane.list_queued(session_id="other") == []


async def test_a_dormant_session_is_woken_once_and_reject_refuses_when_busy(
    plane: SqlControlPlane,
) -> None:
    row, held = await plane.add_queued(
        session_id="s1", message_id="m1", text="a", policy="enqueue", who=None
    )
    assert row is not None and not held
    await plane.add_queued(session_id="s1", message_id="m2", text="b", policy="enqueue", who=None)
    wakes = await plane.pending_wakes(session_id="s1")
    assert [w.message for w in wakes] == [None]  # one plain wake for both
    # reject: refused while messages wait (and while a wake is due)
    refused, _ = await plane.add_queued(
        session_id="s1", message_id="m3", text="c", policy="reject", who=None, refuse_busy=True
    )
    assert refused is None and await _texts(plane, "s1") == ["a", "b"]
    # a session with nothing to do takes it
    row, _ = await plane.add_queued(
        session_id="s2", message_id="m4", text="c", policy="reject", who=None, refuse_busy=True
    )
    assert row is not None
    # a held session refuses reject too
    lease = await plane.acquire_session(session_id="s3", holder="w", ttl_s=60)
    assert lease is not None
    refused, held = await plane.add_queued(
        session_id="s3", message_id="m5", text="d", policy="reject", who=None, refuse_busy=True
    )
    assert refused is None and held
    # what the holder left when it let go is woken for
    await plane.add_queued(session_id="s3", message_id="m6", text="e", policy="enqueue", who=None)
    assert await plane.wake_queued(session_id="s3") is False  # still held
    await plane.release_session(lease=lease)
    assert await plane.wake_queued(session_id="s3") is True
    assert await plane.wake_queued(session_id="s3") is False  # one waits already
    assert await plane.wake_queued(session_id="nothing-queued") is False


async def test_an_urgent_wake_is_claimed_before_older_ones(plane: SqlControlPlane) -> None:
    first = await plane.send(session_id="s1", message="older")
    urgent = await plane.send(session_id="s1", message="now", urgent=True)
    claimed = await plane.claim_sessions(holder="w", limit=4, ttl_s=60)
    assert [c.wake.id for c in claimed] == [urgent]
    await plane.end_wake(wake_id=urgent, lease=claimed[0].lease)
    (again,) = await plane.claim_sessions(holder="w", limit=4, ttl_s=60)
    assert again.wake.id == first


async def test_two_senders_racing_keep_one_order(plane: SqlControlPlane) -> None:
    async def send(who: str) -> None:
        for i in range(5):
            await plane.add_queued(
                session_id="s1", message_id=f"{who}{i}", text=f"{who}{i}", policy="enqueue",
                who=who,
            )  # fmt: skip

    await asyncio.gather(send("a"), send("b"))
    rows = await plane.list_queued(session_id="s1")
    assert sorted(r.position for r in rows) == list(range(10))
    for who in ("a", "b"):  # each sender's messages in the order it sent them
        assert [r.text for r in rows if r.who == who] == [f"{who}{i}" for i in range(5)]


async def test_mode_requests_belong_to_one_lease_grant(plane: SqlControlPlane) -> None:
    assert await plane.request_mode(session_id="s1", mode="plan", who="t") is None  # nobody
    lease = await plane.acquire_session(session_id="s1", holder="w", ttl_s=60)
    assert lease is not None
    made = await plane.request_mode(session_id="s1", mode="plan", who="t")
    assert made is not None and (made.status, made.epoch) == ("pending", lease.epoch)
    assert [r.id for r in await plane.pending_modes(lease=lease)] == [made.id]
    await plane.settle_mode(request_id=made.id, status="changed", previous="ask")
    await plane.settle_mode(request_id=made.id, status="not_running")  # settled once
    found = await plane.get_mode_request(request_id=made.id)
    assert found is not None and (found.status, found.previous) == ("changed", "ask")
    assert await plane.pending_modes(lease=lease) == []
    await plane.release_session(lease=lease)
    later = await plane.acquire_session(session_id="s1", holder="w2", ttl_s=60)
    assert later is not None
    again = await plane.request_mode(session_id="s1", mode="ask", who=None)
    assert again is not None
    assert await plane.pending_modes(lease=lease) == []  # an old grant never sees it
    assert [r.id for r in await plane.pending_modes(lease=later)] == [again.id]
